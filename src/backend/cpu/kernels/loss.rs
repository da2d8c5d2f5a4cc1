//! `SoftmaxCrossEntropyLoss` on [N, C] scores: LogSoftmax of each row (the vectorized
//! kernel of [`super::softmax`]) into the log_prob output, then the negative log
//! probability of each label, reduced by none, sum or mean. Labels equal to
//! `ignore_index` count for nothing (and not in the mean's count).
use super::scatter::Index;
use super::softmax::log_softmax_isa;
use crate::backend::cpu::isa::Isa;
use crate::backend::cpu::pool::Pool;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LossReduction {
    None,
    Sum,
    Mean,
}

impl LossReduction {
    pub(crate) fn from_attr(s: &str) -> Option<LossReduction> {
        Some(match s {
            "none" => LossReduction::None,
            "sum" => LossReduction::Sum,
            "mean" => LossReduction::Mean,
            _ => return None,
        })
    }
}

/// Writes `log_prob` [rows × classes] and `loss` ([rows] for `None`, else one value).
#[allow(clippy::too_many_arguments)]
pub(crate) fn softmax_cross_entropy<I: Index>(
    isa: Isa,
    scores: &[f32],
    labels: &[I],
    classes: usize,
    reduction: LossReduction,
    ignore_index: Option<i64>,
    log_prob: &mut [f32],
    loss: &mut [f32],
    pool: Option<&Pool>,
) -> Result<(), String> {
    let rows = labels.len();
    assert!(scores.len() == rows * classes && log_prob.len() == rows * classes);
    log_softmax_isa(isa, scores, log_prob, rows, classes, pool);
    // Summed in f64 like the interpreter: the batch's terms differ widely in size.
    let (mut total, mut count) = (0.0f64, 0usize);
    for (r, &label) in labels.iter().enumerate() {
        let t = label.get();
        let term = if Some(t) == ignore_index {
            0.0
        } else if t < 0 || t as usize >= classes {
            return Err(format!("label {t} is out of range for {classes} classes"));
        } else {
            count += 1;
            -log_prob[r * classes + t as usize]
        };
        if reduction == LossReduction::None {
            loss[r] = term;
        }
        total += term as f64;
    }
    match reduction {
        LossReduction::None => {}
        LossReduction::Sum => loss[0] = total as f32,
        LossReduction::Mean => loss[0] = (total / count as f64) as f32,
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::testutil::{lcg_data, pools};
    use super::*;

    #[test]
    fn matches_the_definition_with_each_reduction_and_ignored_labels() {
        for isa in [Isa::Portable, Isa::Avx2] {
            for pool in pools() {
                for (rows, classes) in [(1, 1), (5, 3), (64, 10), (7, 37)] {
                    let scores = lcg_data(rows * classes, 4.0, rows as u64);
                    let labels: Vec<i64> =
                        (0..rows as i64).map(|r| (r * 7) % classes as i64).collect();
                    for reduction in [LossReduction::None, LossReduction::Sum, LossReduction::Mean]
                    {
                        for ignore in [None, Some(0)] {
                            let mut lp = vec![0.0; rows * classes];
                            let out = if reduction == LossReduction::None {
                                rows
                            } else {
                                1
                            };
                            let mut loss = vec![f32::NAN; out];
                            softmax_cross_entropy(
                                isa,
                                &scores,
                                &labels,
                                classes,
                                reduction,
                                ignore,
                                &mut lp,
                                &mut loss,
                                pool.as_ref(),
                            )
                            .unwrap();
                            let (mut sum, mut n) = (0.0f64, 0);
                            for r in 0..rows {
                                let row = &scores[r * classes..(r + 1) * classes];
                                let max =
                                    row.iter().fold(f64::NEG_INFINITY, |m, &v| m.max(v as f64));
                                let lse = row
                                    .iter()
                                    .map(|&v| (v as f64 - max).exp())
                                    .sum::<f64>()
                                    .ln()
                                    + max;
                                for c in 0..classes {
                                    let want = row[c] as f64 - lse;
                                    assert!((lp[r * classes + c] as f64 - want).abs() < 1e-5);
                                }
                                let t = labels[r];
                                let term = if Some(t) == ignore {
                                    0.0
                                } else {
                                    n += 1;
                                    lse - row[t as usize] as f64
                                };
                                if reduction == LossReduction::None {
                                    assert!((loss[r] as f64 - term).abs() < 1e-5);
                                }
                                sum += term;
                            }
                            let want = match reduction {
                                LossReduction::None => continue,
                                LossReduction::Sum => sum,
                                LossReduction::Mean => sum / n as f64,
                            };
                            assert!(
                                (loss[0] as f64 - want).abs() < 1e-5 * (1.0 + want.abs())
                                    || (want.is_nan() && loss[0].is_nan()),
                                "{rows}×{classes} {reduction:?} {ignore:?}: {} vs {want}",
                                loss[0]
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn a_label_out_of_range_is_an_error() {
        let (mut lp, mut loss) = (vec![0.0; 4], vec![0.0]);
        let e = softmax_cross_entropy(
            Isa::Portable,
            &[0.0; 4],
            &[0i64, 2],
            2,
            LossReduction::Mean,
            None,
            &mut lp,
            &mut loss,
            None,
        );
        assert_eq!(e.unwrap_err(), "label 2 is out of range for 2 classes");
    }
}
