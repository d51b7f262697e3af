"""GRPO on a softmax bandit, exactly: the solvable toy beside the language-model runs of
group_size_dynamics.py, where the inertial model's predictions ("Predictable GRPO", arXiv 2606.30789, whose
own stability and oscillation results are on such a bandit) can be checked without sampling noise.

The policy is softmax(theta) over K answers, the first C correct (reward 1, else 0); one completion is
one token, so GRPO's loss (group_std advantages with ddof=1, the ppo_clip unit loss, k3 KL to the
initial policy, mean over completions: docs/algorithms.md) has a closed-form expectation over the
group. Given k correct answers in a group of G, every correct sample has advantage (1 - k/G)/(std_k + eps)
and every wrong one -(k/G)/(std_k + eps); the correct samples are drawn from pi_old restricted to the
correct answers, the wrong ones from the rest. Summing over k ~ Binomial(G, p_old) gives the expected
gradient of the loss at theta for a rollout batch drawn from theta_old:

    -s_G(p_old) [sum_{a correct} m_a pi_a (e_a - pi) / p_old - sum_{a wrong} m_a pi_a (e_a - pi) / (1 - p_old)]
    + beta sum_a pi_old_a (1 - ref_a / pi_a) (e_a - pi),
    s_G(p) = E_k[k (G - k) / (G^2 (std_k + eps))],

with m_a the clip masks (a correct answer stops pushing once pi_a / pi_old_a > 1 + eps_high, a wrong one
once it is < 1 - eps_low). As G -> infinity s_G(p) -> sqrt(p (1 - p)); at finite G it is smaller (the
group std is a noisy denominator): the group size changes the expected step, not only its noise.
`expected_grad` is that formula; tests/test_group_size_dynamics.py checks it against a sum over every
group a multinomial draw can give and against `sampled_grad` (Monte Carlo).

From a symmetric start (all correct answers alike, all wrong ones alike) the dynamics stay in one
coordinate, the logit gap u = theta_correct - theta_wrong, with p = P(correct) = sigmoid(u + log(C / (K - C))):
the mean-field reduction of the inertial model is exact here. With beta > 0 the drift has a fixed point
p* < 1 and a stiffness kappa (the drift's slope there, measured from `expected_grad`), and the linear
theory of the optimizers around it is classical (Polyak 1964): SGD with heavy-ball momentum mu has the
characteristic polynomial z^2 - (1 + mu - lr kappa) z + mu (oscillatory once lr kappa > (1 - sqrt(mu))^2,
`oscillation_onset`; unstable past 2 (1 + mu)); Adam near the fixed point is heavy ball with mu = b1 and the
learning rate lr (1 - b1) / sqrt(v) of its second-moment state (`adam_lr`); `updates_per_batch` > 1 steps
from a stale theta_old (the refresh interval of the inertial model) compose to a map per rollout batch,
`batch_multiplier`, whose gains through the current and the stale policy (`gains`) differ: the stiffness
kappa = -(a + b) alone does not set its threshold.
"""

import dataclasses
import functools
import math

import numpy as np
from scipy import optimize


@dataclasses.dataclass(frozen=True)
class Bandit:
    """K = `answers` answers, the first `correct` right; the initial (and reference) policy puts
    probability `p0` on the correct ones, spread evenly."""

    answers: int = 8
    correct: int = 2
    p0: float = 0.1

    def __post_init__(self):
        if not 0 < self.correct < self.answers:
            raise ValueError(f"Bandit: correct={self.correct} must be in (0, answers={self.answers})")
        if not 0 < self.p0 < 1:
            raise ValueError(f"Bandit: p0={self.p0} must be in (0, 1)")

    @property
    def rewards(self) -> np.ndarray:
        return (np.arange(self.answers) < self.correct).astype(float)

    def logits(self, p: float) -> np.ndarray:
        """Symmetric logits with P(correct) = p: 0 on the wrong answers, the gap u on the correct ones."""
        return self.rewards * (math.log(p / (1 - p)) - math.log(self.correct / (self.answers - self.correct)))

    def prob(self, gap: float) -> float:
        """P(correct) of the symmetric policy with logit gap u."""
        return 1 / (1 + math.exp(-gap - math.log(self.correct / (self.answers - self.correct))))

    def gap(self, theta: np.ndarray) -> float:
        """u: mean logit of the correct answers minus that of the wrong ones."""
        r = self.rewards
        return float(theta @ r / r.sum() - theta @ (1 - r) / (1 - r).sum())


@dataclasses.dataclass(frozen=True)
class Grpo:
    """The GRPO objective of the toy. group_size=None is the limit G -> infinity (exact statistics).
    `updates_per_batch` (num_iterations x minibatches): optimizer updates per rollout batch; in
    expectation every minibatch is the whole batch, so only their number matters."""

    group_size: int | None = 8
    beta: float = 0.0
    eps_low: float = 0.2
    eps_high: float = 0.2
    adv_eps: float = 1e-6
    updates_per_batch: int = 1

    def __post_init__(self):
        if self.group_size is not None and self.group_size < 2:
            raise ValueError(f"Grpo: group_size={self.group_size} must be >= 2 (or None for the G -> infinity limit)")
        if self.updates_per_batch < 1:
            raise ValueError(f"Grpo: updates_per_batch={self.updates_per_batch} must be >= 1")


def softmax(theta: np.ndarray) -> np.ndarray:
    e = np.exp(theta - theta.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def group_weight(p: float, alg: Grpo) -> float:
    """s_G(p) = E_k[k (G - k) / (G^2 (std_k + eps))], k ~ Binomial(G, p), std with ddof=1: the expected
    total |advantage| / G on either side of a group; sqrt(p (1 - p)) for G = infinity."""
    if alg.group_size is None:
        return math.sqrt(p * (1 - p))
    g = alg.group_size
    k = np.arange(1, g)
    std = np.sqrt(k * (g - k) / (g * (g - 1)))
    return float(binomial_pmf(g, p)[1:-1] @ (k * (g - k) / (g * g * (std + alg.adv_eps))))


def binomial_pmf(n: int, p: float) -> np.ndarray:
    """P(k successes of n), k = 0..n (scipy's binom.pmf costs more than the rest of a toy step)."""
    k = np.arange(n + 1)
    return np.array([math.comb(n, i) for i in k], float) * p ** k * (1 - p) ** (n - k)


def expected_grad(theta, theta_old, theta_ref, bandit: Bandit, alg: Grpo) -> np.ndarray:
    """The exact expected gradient of GRPO's loss at theta over rollout groups drawn from theta_old."""
    pi, old, ref = softmax(theta), softmax(theta_old), softmax(theta_ref)
    right = bandit.rewards.astype(bool)
    p_old = old[right].sum()
    ratio = pi / old
    keep = np.where(right, ratio <= 1 + alg.eps_high, ratio >= 1 - alg.eps_low)
    side = np.where(right, 1 / p_old, -1 / (1 - p_old)) * keep * pi  # per answer: weight of e_a - pi
    pg = side - side.sum() * pi
    kl = old * (1 - ref / pi)
    return -group_weight(p_old, alg) * pg + alg.beta * (kl - kl.sum() * pi)


def group_grads(theta, theta_old, theta_ref, bandit: Bandit, alg: Grpo, answers: np.ndarray) -> np.ndarray:
    """The gradient of GRPO's loss on each group of sampled `answers` ([groups, G] indices)."""
    pi, old, ref = softmax(theta), softmax(theta_old), softmax(theta_ref)
    r = bandit.rewards[answers]
    std = r.std(-1, ddof=1, keepdims=True)
    adv = np.where(std > 0, (r - r.mean(-1, keepdims=True)) / (std + alg.adv_eps), 0.0)
    ratio = pi[answers] / old[answers]
    keep = np.where(adv > 0, ratio <= 1 + alg.eps_high, np.where(adv < 0, ratio >= 1 - alg.eps_low, True))
    coef = -adv * ratio * keep + alg.beta * (1 - ref[answers] / pi[answers])  # d(unit loss) / d log pi(a)
    groups, k = answers.shape[0], bandit.answers
    rows = np.repeat(np.arange(groups), answers.shape[1])
    per_answer = np.bincount(rows * k + answers.ravel(), coef.ravel(), groups * k).reshape(groups, k)
    return (per_answer - coef.sum(-1, keepdims=True) * pi) / answers.shape[1]  # sum of coef (e_a - pi) / G


def sampled_grad(theta, theta_old, theta_ref, bandit: Bandit, alg: Grpo, rng: np.random.Generator,
                 groups: int) -> np.ndarray:
    """The gradient of GRPO's loss on `groups` groups drawn from theta_old (what a run computes); its
    mean over draws is `expected_grad`."""
    if alg.group_size is None:
        raise ValueError("sampled_grad needs a finite group_size")
    answers = rng.choice(bandit.answers, size=(groups, alg.group_size), p=softmax(theta_old))
    return group_grads(theta, theta_old, theta_ref, bandit, alg, answers).mean(0)


# -- optimizers (optax's update rules, float64) -----------------------------------------------


@dataclasses.dataclass(frozen=True)
class Sgd:
    """optax.sgd: v = g + momentum v; theta -= lr v."""

    lr: float
    momentum: float = 0.0

    def init(self, theta):
        return np.zeros_like(theta)

    def update(self, state, g):
        v = g + self.momentum * state
        return -self.lr * v, v


@dataclasses.dataclass(frozen=True)
class Adam:
    """optax.adam (the LM runs' AdamW with weight_decay=0), bias-corrected moments."""

    lr: float
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8

    def init(self, theta):
        return 0, np.zeros_like(theta), np.zeros_like(theta)

    def update(self, state, g):
        t, m, v = state
        t, m, v = t + 1, self.b1 * m + (1 - self.b1) * g, self.b2 * v + (1 - self.b2) * g * g
        m_hat, v_hat = m / (1 - self.b1 ** t), v / (1 - self.b2 ** t)
        return -self.lr * m_hat / (np.sqrt(v_hat) + self.eps), (t, m, v)


def run(bandit: Bandit, alg: Grpo, opt, steps: int, *, p_start: float | None = None, rng=None,
        groups: int = 0) -> tuple[np.ndarray, list]:
    """(P(correct) at the start of each rollout batch, steps + 1 values, nan from a divergence on; the
    optimizer state after each batch). With `rng`, every update draws `groups` fresh groups
    (sampled_grad), else it takes the exact expectation. The reference policy is the bandit's initial
    one; `p_start` moves the start."""
    ref = bandit.logits(bandit.p0)
    theta = bandit.logits(bandit.p0 if p_start is None else p_start)
    state, states = opt.init(theta), []
    ps = np.full(steps + 1, np.nan)
    right = bandit.rewards.astype(bool)
    with np.errstate(all="ignore"):  # a diverging run overflows; it stops at the first non-finite logit
        for step in range(steps + 1):
            if not np.all(np.isfinite(theta)):
                break
            ps[step] = softmax(theta)[right].sum()
            if step == steps:
                break
            old = theta
            for _ in range(alg.updates_per_batch):
                g = (sampled_grad(theta, old, ref, bandit, alg, rng, groups) if rng is not None
                     else expected_grad(theta, old, ref, bandit, alg))
                delta, state = opt.update(state, g)
                theta = theta + delta
            states.append(state)
    return ps, states


# -- the linear theory around the fixed point -------------------------------------------------


def drift(p: float, bandit: Bandit, alg: Grpo) -> float:
    """d u per unit SGD learning rate, on-policy at the symmetric policy with P(correct) = p."""
    theta = bandit.logits(p)
    return -bandit.gap(expected_grad(theta, theta, bandit.logits(bandit.p0), bandit, alg))


@functools.cache
def fixed_point(bandit: Bandit, alg: Grpo) -> float:
    """p* where the on-policy drift vanishes (needs beta > 0: without KL p -> 1); the drift is positive at
    p0 (the KL term vanishes there) and negative near 1."""
    if alg.beta <= 0:
        raise ValueError("fixed_point needs Grpo.beta > 0: without the KL term the drift pushes p to 1")
    return optimize.brentq(drift, bandit.p0, 1 - 1e-9, args=(bandit, alg), xtol=1e-15, rtol=1e-15)


def gains(bandit: Bandit, alg: Grpo, h: float = 1e-6) -> tuple[float, float]:
    """(a, b): d(drift)/du through the current policy and through the stale one (theta_old), per unit
    SGD learning rate, at the fixed point. The stiffness is kappa = -(a + b)."""
    p = fixed_point(bandit, alg)
    ref, base = bandit.logits(bandit.p0), bandit.logits(p)
    shift = bandit.rewards * h

    def du(theta, old):
        return -bandit.gap(expected_grad(theta, old, ref, bandit, alg))

    a = (du(base + shift, base) - du(base - shift, base)) / (2 * h)
    b = (du(base, base + shift) - du(base, base - shift)) / (2 * h)
    return a, b


def stiffness(bandit: Bandit, alg: Grpo) -> float:
    a, b = gains(bandit, alg)
    return -(a + b)


def drift_noise(p: float, bandit: Bandit, alg: Grpo) -> float:
    """Variance over one group's draw of its u-step per unit SGD learning rate, on-policy at the symmetric
    policy with P(correct) = p: a function of the number k of correct answers only (the group's
    advantages sum to 0, and the KL term's u-component depends only on correctness)."""
    g, theta = alg.group_size, bandit.logits(p)
    k = np.arange(g + 1)
    answers = np.where(np.arange(g) < k[:, None], 0, bandit.correct)  # k correct, g - k wrong
    step = [-bandit.gap(x) for x in group_grads(theta, theta, bandit.logits(bandit.p0), bandit, alg, answers)]
    w = binomial_pmf(g, p)
    return float(w @ (np.asarray(step) - w @ step) ** 2)


def sgd_stationary_variance(bandit: Bandit, alg: Grpo, lr: float, groups: int) -> float:
    """Var(P(correct)) around p* under on-policy SGD with `groups` groups per update, to first order:
    x_{t+1} = (1 - lr kappa) x_t + lr noise, Var = lr^2 noise / (groups lr kappa (2 - lr kappa)),
    mapped to p by dp/du = p (1 - p)."""
    p, gain = fixed_point(bandit, alg), lr * stiffness(bandit, alg)
    return (p * (1 - p)) ** 2 * lr ** 2 * drift_noise(p, bandit, alg) / (groups * gain * (2 - gain))


def oscillation_onset(momentum: float) -> float:
    """The gain at which heavy ball turns oscillatory (complex roots): (1 - sqrt(mu))^2."""
    return (1 - math.sqrt(momentum)) ** 2


def batch_multiplier(lr: float, a: float, b: float, n: int) -> float:
    """u - u* after one rollout batch of n SGD updates from a stale theta_old, per unit before:
    x_{j+1} = x_j + lr (a x_j + b x_0) composed n times. Stable iff |.| < 1; negative: oscillates."""
    q = (1 + lr * a) ** n
    return q + (b / a) * (q - 1) if a != 0 else 1 + n * lr * b


def adam_lr(bandit: Bandit, opt: Adam, state) -> float:
    """The SGD learning rate that moves u as Adam's per-coordinate steps lr / sqrt(v_hat) do, with its
    second-moment `state` frozen (its momentum is the heavy ball's, separately)."""
    t, _, v = state
    inv = opt.lr / (np.sqrt(v / (1 - opt.b2 ** t)) + opt.eps)
    r = bandit.rewards
    c, w = r.sum(), (1 - r).sum()
    return float((inv @ r / c ** 2 + inv @ (1 - r) / w ** 2) / (1 / c + 1 / w))
