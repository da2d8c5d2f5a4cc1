"""Zoo models of speech quality and music transcription shipped in wheels (speechmos:
Microsoft's DNSMOS, AECMOS and PLCMOS; basic-pitch: Spotify's note transcriber), with
the features each package computes, here in numpy (scripts/model-zoo.py calls
`shipped_audio`). Each returns (name, model, feeds, source) like model-zoo.py's models."""
import numpy as np


def frames(signal, size, hop):
    """[frames, size] windows of signal, centred as librosa pads (reflect, size // 2)."""
    padded = np.pad(signal, size // 2, mode="reflect")
    count = 1 + (len(padded) - size) // hop
    idx = np.arange(size)[None, :] + hop * np.arange(count)[:, None]
    return padded[idx]


def power_spectrum(signal, n_fft, hop):
    """|STFT|^2 with a periodic Hann window: [frames, n_fft // 2 + 1], float64."""
    window = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(n_fft) / n_fft)
    return np.abs(np.fft.rfft(frames(signal.astype(np.float64), n_fft, hop) * window, axis=1)) ** 2


def mel_db(signal, n_fft, hop, n_mels, mel_filterbank):
    """speechmos' mel features: librosa-style mel power, (power_to_db(ref=max) + 40) / 40."""
    mel = power_spectrum(signal, n_fft, hop) @ mel_filterbank(16000, n_fft, n_mels)
    db = 10 * np.log10(np.maximum(mel, 1e-10))
    db = np.maximum(db - db.max(), -80.0)
    return ((db + 40) / 40).astype(np.float32)


def plucked_notes(samples, rate, seed):
    """An arpeggio of five decaying harmonic notes (A3 to C#5) over a faint noise floor."""
    t = np.arange(samples) / rate
    y = np.zeros(samples)
    for i, f in enumerate([220.0, 277.2, 329.6, 440.0, 554.4]):
        start = i * 0.35
        envelope = np.where(t >= start, np.exp(-(t - start) * 3.0), 0.0)
        y += sum(envelope * np.sin(2 * np.pi * k * f * t) / k for k in range(1, 6))
    noise = np.random.default_rng(seed).standard_normal(samples)
    return (0.2 * y + 0.01 * noise).astype(np.float32)


def shipped_audio(shipped, speech, mel_filterbank):
    """`shipped(name)` gives (model, source) of a shipped model; `speech(samples, seed)`
    is model-zoo.py's voiced-speech maker, `mel_filterbank` zoo_made's triangles."""
    out = []
    # DNSMOS P.835 on raw audio (its mel front end is in the graph): 9.01 s at 16 kHz.
    clip = speech(144160, 41)
    m, src = shipped("dnsmos_sig_bak_ovr")
    out.append(("dnsmos_sig_bak_ovr", m, {"input_1": clip[None]}, src))
    # DNSMOS P.808 on 120 mel bands of the same clip less its last hop (900 frames).
    m, src = shipped("dnsmos_p808")
    out.append(("dnsmos_p808", m, {"input_1": mel_db(clip[:-160], 321, 160, 120, mel_filterbank)[None]}, src))
    # AECMOS (16 kHz): loopback, microphone and enhanced clips as 160 mel bands (dft 512,
    # hop 256); the scenario model wants each followed by the package's 20-frame marker
    # (double talk: ones) and 20 zeros, the scenarioless one not.
    far = speech(16000, 42)
    near = speech(16000, 43)
    clips = [mel_db(s, 513, 256, 160, mel_filterbank) for s in (far, 0.6 * far + near, near + 0.05 * far)]
    marker = [np.ones((20, 160), np.float32), np.zeros((20, 160), np.float32)]
    for name, feats in [("aecmos_16k", np.stack([np.concatenate([c] + marker) for c in clips])[None]),
                        ("aecmos_16k_scenarioless", np.stack(clips)[None])]:
        m, src = shipped(name)
        out.append((name, m, {"input": feats, "h0": np.zeros((4, 1, 64), np.float32)}, src))
    # PLCMOS v2: log power of a 512-point STFT (hop 256) and a seeded rater embedding.
    power = power_spectrum(speech(16000, 44), 512, 256)
    logp = np.log(np.maximum(power, 1e-12)).astype(np.float32)
    rater = np.random.default_rng(45).standard_normal((1, 64)).astype(np.float32)
    m, src = shipped("plcmos_v2")
    out.append(("plcmos_v2", m, {"degraded_audio": logp[None, None], "rater_embed": rater}, src))
    # basic-pitch: one 43,844-sample window of 22.05 kHz music. Its log-CQT front end
    # makes near-silent bins ill-conditioned (onnxruntime with and without its graph
    # optimizations differ by 3e-4), so the recording has a noise floor as real ones do.
    m, src = shipped("basic_pitch_nmp")
    out.append(("basic_pitch_nmp", m, {"serving_default_input_2:0": plucked_notes(43844, 22050, 46)[None, :, None]},
                src))
    return out
