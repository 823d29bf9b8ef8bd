"""Generated data sets: text with Zipf word frequencies, images with learnable patterns."""
from __future__ import annotations

import numpy as np
import torch
from torch.nn import functional as F


def synthetic_text(num_tokens: int, vocab_size: int, seed: int = 0, branching: int = 4,
                   noise: float = 0.05, zipf: float = 0.0) -> torch.Tensor:
    """A learnable token stream from a random sparse Markov chain, int64 ``[num_tokens]``.

    Each token has ``branching`` successors drawn once from the vocabulary, taken with
    probabilities decreasing as 1/2, 1/4, ...; with probability ``noise`` the next token is
    drawn afresh instead. A model that learns the chain reaches a perplexity of about
    ``branching`` or less, far below ``vocab_size`` (uniform noise would not be learnable).
    With ``zipf`` > 0, successors and fresh tokens are drawn with probability proportional
    to ``1 / rank ** zipf`` (word frequencies in real text follow such a law, ``zipf`` ~ 1):
    a large vocabulary whose frequent words are learnt quickly and whose rare rows of the
    embedding and output layers get rare gradients, as with real text.

    Example::

        tokens = synthetic_text(100_000, vocab_size=1000, seed=0)
        train = batchify(tokens, batch_size=20)
    """
    if num_tokens < 1 or vocab_size < 2 or branching < 1:
        raise ValueError(f"synthetic_text: need num_tokens >= 1, vocab_size >= 2, branching >= 1, "
                         f"got {num_tokens}, {vocab_size}, {branching}")
    if not 0.0 <= noise <= 1.0:
        raise ValueError(f"synthetic_text: noise must be in [0, 1], got {noise}")
    if zipf < 0:
        raise ValueError(f"synthetic_text: zipf must be >= 0 (0 = uniform), got {zipf}")
    rng = np.random.default_rng(seed)
    if zipf > 0:
        word_p = 1.0 / np.arange(1, vocab_size + 1) ** zipf
        word_p /= word_p.sum()
        successors = rng.choice(vocab_size, size=(vocab_size, branching), p=word_p)
        uniform = rng.choice(vocab_size, size=num_tokens, p=word_p)
    else:
        successors = rng.integers(0, vocab_size, size=(vocab_size, branching))
        uniform = rng.integers(0, vocab_size, size=num_tokens)
    slot_p = 0.5 ** np.arange(1, branching + 1)
    slot_p /= slot_p.sum()
    slots = rng.choice(branching, size=num_tokens, p=slot_p)
    is_noise = rng.random(num_tokens) < noise
    # The chain is sequential; plain Python lists make this loop ~10x faster than numpy scalars.
    succ = successors.tolist()
    slots_l, uniform_l, noise_l = slots.tolist(), uniform.tolist(), is_noise.tolist()
    out = [0] * num_tokens
    cur = uniform_l[0]
    for t in range(num_tokens):
        out[t] = cur
        cur = uniform_l[t] if noise_l[t] else succ[cur][slots_l[t]]
    return torch.tensor(out, dtype=torch.int64)


def synthetic_images(n: int, num_classes: int, image_size: int = 32, channels: int = 3,
                     seed: int = 0, noise_std: float = 40.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Learnable class-dependent images, in the same format as ``load_cifar``.

    Each class has a smooth random pattern (a 4x4 grid upsampled, mirrored so that
    horizontal flips keep it); an image is its class pattern plus Gaussian pixel noise of
    ``noise_std`` (on the 0..255 scale). Classes are balanced and shuffled.

    Returns ``(images, labels)``: uint8 ``[n, channels, image_size, image_size]``, int64 ``[n]``.

    Example::

        images, labels = synthetic_images(5000, num_classes=10, seed=0)
        x = Normalize()(images[:64])       # or CifarAugment, as for CIFAR
    """
    if n < 1 or num_classes < 1 or image_size < 1 or channels < 1:
        raise ValueError(f"synthetic_images: n, num_classes, image_size and channels must be >= 1, "
                         f"got {n}, {num_classes}, {image_size}, {channels}")
    g = torch.Generator().manual_seed(seed)
    coarse = torch.rand(num_classes, channels, 4, 4, generator=g)
    patterns = F.interpolate(coarse, size=(image_size, image_size), mode="bilinear",
                             align_corners=False)
    patterns = 0.5 * (patterns + patterns.flip(-1))
    # Stretch each pattern to the full 0..255 range so classes differ by more than the noise.
    lo = patterns.amin(dim=(1, 2, 3), keepdim=True)
    hi = patterns.amax(dim=(1, 2, 3), keepdim=True)
    patterns = (patterns - lo) / (hi - lo).clamp_min(1e-6) * 255.0
    labels = (torch.arange(n) % num_classes)[torch.randperm(n, generator=g)]
    images = torch.empty(n, channels, image_size, image_size, dtype=torch.uint8)
    chunk = 4096  # bounded float temporaries for large n
    for s in range(0, n, chunk):
        lab = labels[s:s + chunk]
        x = patterns[lab] + noise_std * torch.randn(len(lab), channels, image_size, image_size,
                                                    generator=g)
        images[s:s + chunk] = x.round_().clamp_(0, 255).to(torch.uint8)
    return images, labels
