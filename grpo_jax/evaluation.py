"""Held-out evaluation: one greedy and n sampled completions per prompt, scored by the run's rewards.

Metrics: `eval/accuracy_greedy`, `eval/accuracy_sampled` (the mean over the n samples: avg@n, which
is also the unbiased pass@1) and `eval/pass@k` for k = 2, 4, ..., n (and n itself), with the rewards
and lengths of both modes. Where every held-out example names its "bucket" (a difficulty or length
class of the task), the accuracies also per bucket: `eval/accuracy_greedy@BUCKET`. Per example: the greedy completion, its rewards and correctness, and the
number of the n samples that were correct.
"""

import numpy as np


def pass_at_k(n: int, correct, k: int) -> np.ndarray:
    """The unbiased estimate of pass@k per problem, from n samples of which `correct` (an array) are right:
    1 - C(n - c, k) / C(n, k) (Chen et al. 2021, arXiv:2107.03374, eq. 1), computed as the product
    1 - prod_{i = n - c + 1}^{n} (1 - k / i), which needs no large binomials."""
    if not 1 <= k <= n:
        raise ValueError(f"pass@{k} needs 1 <= k <= n={n} samples per problem")
    c = np.asarray(correct, np.int64)
    i = np.arange(1, n + 1)
    terms = np.where(i[None, :] > (n - c.reshape(-1))[:, None], 1.0 - k / i, 1.0)
    return (1.0 - np.prod(terms, axis=1)).reshape(c.shape)


def pass_ks(n: int) -> list[int]:
    """The k of the pass@k metrics for n samples: 2, 4, 8, ... below n, and n (none for n = 1)."""
    return sorted({2**j for j in range(1, n.bit_length()) if 2**j < n} | ({n} if n > 1 else set()))


def summarize(mode: str, n: int, total, lengths, correct, buckets=None) -> dict[str, float]:
    """The eval/ metrics of one mode ("greedy" or "sampled") from per-completion arrays, prompt-major
    (n consecutive completions per prompt); `correct` is None for a run without a correctness reward;
    `buckets` (one label per prompt, or None) adds the accuracy of each bucket's prompts."""
    out = {f"eval/reward_{mode}": float(np.mean(total)), f"eval/length_{mode}": float(np.mean(lengths))}
    if correct is not None:
        out[f"eval/accuracy_{mode}"] = float(np.mean(correct))
        if buckets is not None:
            labels = np.repeat(np.asarray(buckets, str), n)
            out.update({f"eval/accuracy_{mode}@{b}": float(np.mean(np.asarray(correct)[labels == b]))
                        for b in sorted(set(buckets))})
        per_prompt = np.asarray(correct).reshape(-1, n).sum(axis=1)
        out.update({f"eval/pass@{k}": float(pass_at_k(n, per_prompt, k).mean()) for k in pass_ks(n)})
    return out
