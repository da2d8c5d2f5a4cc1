//! MaxPool with its Indices output over non-overlapping windows (kernel = strides, no
//! pads, no dilation, floor mode): the pools of a trained CNN, whose Indices feed the
//! gradient's scatter. Each window is read row by row from its first element; the first
//! maximum in row-major order wins (a NaN wins only as the first element), as in the
//! general pooling kernel and the interpreter.
use super::par::{for_ranges, SyncPtr};
use crate::backend::cpu::pool::Pool;

/// Pools `x` [planes × h × w] by `kernel` windows into `y` and `indices` (flat over the
/// whole input), each [planes × h/kh × w/kw].
pub(crate) fn max_pool_tiles(
    x: &[f32],
    planes: usize,
    [h, w]: [usize; 2],
    [kh, kw]: [usize; 2],
    y: &mut [f32],
    indices: &mut [i64],
    pool: Option<&Pool>,
) {
    let (oh, ow) = (h / kh, w / kw);
    assert!(kh > 0 && kw > 0 && x.len() == planes * h * w);
    assert!(y.len() == planes * oh * ow && indices.len() == y.len());
    let (yp, ip) = (SyncPtr(y.as_mut_ptr()), SyncPtr(indices.as_mut_ptr()));
    for_ranges(pool, planes, h * w, &|range| {
        for plane in range {
            let xs = &x[plane * h * w..(plane + 1) * h * w];
            let at = plane * oh * ow;
            // SAFETY: each task writes only its own output planes.
            let (ys, is) = unsafe {
                (
                    std::slice::from_raw_parts_mut(yp.get().add(at), oh * ow),
                    std::slice::from_raw_parts_mut(ip.get().add(at), oh * ow),
                )
            };
            for i in 0..oh {
                for j in 0..ow {
                    let first = i * kh * w + j * kw;
                    let (mut best, mut arg) = (xs[first], first);
                    for a in 0..kh {
                        let row = first + a * w;
                        for (b, &v) in xs[row..row + kw].iter().enumerate() {
                            if v > best {
                                best = v;
                                arg = row + b;
                            }
                        }
                    }
                    ys[i * ow + j] = best;
                    is[i * ow + j] = (plane * h * w + arg) as i64;
                }
            }
        }
    });
}
