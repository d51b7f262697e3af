"""Samplers that learn from each prompt's record of correct answers (`data.samplers`): which prompts to
draw (VADE's Thompson sampling, a difficulty-pool curriculum, GDRO's bandit over difficulty bins, SPO's
prioritized sampling), how many samples each gets (GDRO's square-root allocation), how hot to sample
them (ERPO), each prompt's baseline (SPO's value tracker), which stored groups to train on again (RePO) and
whose correct answers to lend (AR3PO)."""

import dataclasses

import numpy as np

from grpo_jax.data.samplers import Choice, SamplerParams, batch_indices, sampler


def _top(score: np.ndarray, k: int) -> np.ndarray:
    """The indices of the k largest scores, largest first (ties to the lower index)."""
    part = np.argpartition(-score, k - 1)[:k] if k < len(score) else np.arange(len(score))
    return part[np.lexsort((part, -score[part]))]


@sampler("vade", needs_correctness=True)
@dataclasses.dataclass(frozen=True)
class Vade(SamplerParams):
    """VADE (arXiv 2511.18902): a Beta(alpha, beta) posterior of each prompt's success rate; each round
    draws p ~ Beta per prompt (Thompson sampling) and takes the prompts of largest p (1 - p), the
    variance of a correct answer, which a group-relative advantage needs (p = 0 or 1: no signal).
    Two time scales keep the posterior tracking a moving policy: each observation of a prompt first
    shrinks its evidence toward the prior by `decay`, and every round shrinks all evidence by `forget`
    (prompts not drawn drift back to uncertain, so they are tried again). The shrink toward the prior
    and its two rates are this implementation's reading of the paper's "two-scale prior decay"."""

    prior_alpha: float = 1.0
    prior_beta: float = 1.0
    decay: float = 0.5  # evidence kept when a prompt is observed again
    forget: float = 0.99  # evidence every prompt keeps per round

    def __post_init__(self):
        self.check({
            "prior_alpha": (self.prior_alpha > 0, "must be > 0 (a Beta prior's pseudo-count of successes)"),
            "prior_beta": (self.prior_beta > 0, "must be > 0 (a Beta prior's pseudo-count of failures)"),
            "decay": (0 <= self.decay <= 1, "must be in [0, 1] (1: keep all earlier evidence)"),
            "forget": (0 <= self.forget <= 1, "must be in [0, 1] (1: never forget)"),
        })

    def init(self, size):
        return {"alpha": np.full(size, self.prior_alpha, np.float32), "beta": np.full(size, self.prior_beta, np.float32)}

    def choose(self, state, draw):
        p = draw.rng().beta(state["alpha"], state["beta"])
        return Choice(_top(p * (1 - p), draw.prompts), np.full(draw.prompts, draw.group_size))

    def update(self, state, results):
        prior = {"alpha": self.prior_alpha, "beta": self.prior_beta}
        state = {k: (prior[k] + self.forget * (v - prior[k])).astype(np.float32) for k, v in state.items()}
        i, seen = results.indices, results.trials > 0
        for k, evidence in (("alpha", results.successes), ("beta", results.trials - results.successes)):
            kept = prior[k] + self.decay * (state[k][i] - prior[k])
            state[k][i[seen]] = (kept + evidence)[seen]
        return state


EASY, NORMAL, HARD = 1, 0, 2


@sampler("curriculum", needs_correctness=True)
@dataclasses.dataclass(frozen=True)
class Curriculum(SamplerParams):
    """Difficulty pools in the manner of prime-rl's orchestrator buffer: every prompt starts normal; after
    each round a prompt whose success rate is >= `easy_at` moves to the easy pool, <= `hard_at` to the
    hard pool, else back to normal. A round takes `easy_fraction` and `hard_fraction` of its prompts
    from those pools (what they cannot supply comes from normal) and the rest from the normal pool,
    each uniformly without replacement: solved and hopeless prompts are revisited, but rarely."""

    easy_at: float = 1.0
    hard_at: float = 0.0
    easy_fraction: float = 0.1
    hard_fraction: float = 0.1

    def __post_init__(self):
        self.check({
            "hard_at": (0 <= self.hard_at < self.easy_at, "must be in [0, easy_at) (success rates at or below it are hard)"),
            "easy_at": (self.easy_at <= 1, "must be <= 1 (success rates at or above it are easy)"),
            "easy_fraction": (0 <= self.easy_fraction <= 1, "must be in [0, 1]"),
            "hard_fraction": (0 <= self.hard_fraction <= 1 - self.easy_fraction, "must be in [0, 1 - easy_fraction]"),
        })

    def init(self, size):
        return {"pool": np.full(size, NORMAL, np.int32)}

    def choose(self, state, draw):
        rng, pool, n = draw.rng(), state["pool"], draw.prompts
        want = {EASY: round(self.easy_fraction * n), HARD: round(self.hard_fraction * n)}
        picked = {p: rng.permutation(np.flatnonzero(pool == p)) for p in (EASY, HARD, NORMAL)}
        taken = [picked[p][:want[p]] for p in (EASY, HARD)]
        rest = np.concatenate([picked[NORMAL], picked[EASY][want[EASY]:], picked[HARD][want[HARD]:]])
        indices = np.concatenate([*taken, rest[:n - sum(map(len, taken))]])
        return Choice(indices, np.full(n, draw.group_size))

    def update(self, state, results):
        seen = results.trials > 0
        rate = results.successes[seen] / results.trials[seen]
        pool = state["pool"].copy()
        pool[results.indices[seen]] = np.where(rate >= self.easy_at, EASY, np.where(rate <= self.hard_at, HARD, NORMAL))
        return {"pool": pool}


@sampler("erpo", needs_correctness=True)
@dataclasses.dataclass(frozen=True)
class Erpo(SamplerParams):
    """ERPO (arXiv 2511.04800): the uniform order, but a prompt whose last `streak` rounds were all
    correct (a residual prompt: its group has no signal) is sampled hotter, at sampling.temperature +
    min(`step` * streak, `max_increase`), so that some of its samples fail and its group learns again;
    any round with a wrong answer resets it. Samples drawn hotter are off-policy for the policy at
    sampling.temperature: the erpo preset corrects them with token-level truncated importance weights
    (algorithm.tis_level), an implementation choice of ours. The linear rule and its cap are this
    implementation's reading of the paper's adaptive temperature."""

    step: float = 0.1  # temperature added per consecutive all-correct round
    max_increase: float = 0.5

    def __post_init__(self):
        self.check({"step": (self.step >= 0, "must be >= 0"), "max_increase": (self.max_increase >= 0, "must be >= 0")})

    def init(self, size):
        return {"streak": np.zeros(size, np.int32)}

    def choose(self, state, draw):
        indices = batch_indices(draw.size, draw.prompts, draw.seed, draw.position)
        hotter = np.minimum(self.step * state["streak"][indices], self.max_increase)
        return Choice(indices, np.full(draw.prompts, draw.group_size), (draw.temperature + hotter).astype(np.float32))

    def update(self, state, results):
        seen = results.trials > 0
        streak = state["streak"].copy()
        solved = results.successes[seen] == results.trials[seen]
        streak[results.indices[seen]] = np.where(solved, streak[results.indices[seen]] + 1, 0)
        return {"streak": streak}


def sqrt_allocation(sigma: np.ndarray, slots: int, cap: int) -> np.ndarray:
    """`slots` slots split in proportion to `sigma` (at most `cap` each), by largest remainder (ties to
    the lower index): the allocation that minimizes sum_i sigma_i^2 / n_i under sum_i n_i = slots."""
    want = slots * sigma / sigma.sum() if sigma.sum() > 0 else np.full(len(sigma), slots / len(sigma))
    n = np.minimum(np.floor(want), cap).astype(np.int64)
    while n.sum() < slots:
        n[np.argmax(np.where(n < cap, want - n, -np.inf))] += 1
    return n


@sampler("gdro", needs_correctness=True, allocates=True)
@dataclasses.dataclass(frozen=True)
class Gdro(SamplerParams):
    """GDRO (arXiv 2601.19280), its two games. Prompt-GDRO: prompts fall into `bins` difficulty bins by
    their last observed success rate (and one bin of prompts never seen); each bin keeps an EMA of its
    failure rate (rate `ema`, bias-corrected as Adam's, so a bin drawn rarely is not scored low for
    it; a bin never observed scores 1), and a round draws bins from the multiplicative weights
    q_b ~ exp(`eta` * score_b), mixed with `explore` of uniform, then prompts uniformly within them.
    Rollout-GDRO: the round's `train.prompts_per_step` slots go to those prompts in proportion to
    sigma = sqrt(p (1 - p)), p = (successes + 1) / (trials + 2), at most `max_slots` each: the
    square-root allocation that minimizes the summed variance p (1 - p) / n of the group estimates
    under the fixed budget (a prompt given 0 slots is not drawn). The closed form stands in for the
    paper's shadow-price controller of that budget; `max_slots=1` is Prompt-GDRO alone."""

    bins: int = 4
    eta: float = 2.0
    ema: float = 0.3
    explore: float = 0.1
    max_slots: int = 4

    def __post_init__(self):
        self.check({
            "bins": (self.bins >= 1, "must be >= 1 (difficulty bins of the success rate)"),
            "eta": (self.eta >= 0, "must be >= 0 (0: uniform over bins)"),
            "ema": (0 < self.ema <= 1, "must be in (0, 1]"),
            "explore": (0 <= self.explore <= 1, "must be in [0, 1]"),
            "max_slots": (self.max_slots >= 1, "must be >= 1 (1: every drawn prompt gets group_size samples)"),
        })

    def init(self, size):
        return {"successes": np.zeros(size, np.int32), "trials": np.zeros(size, np.int32),
                "score": np.zeros(self.bins + 1, np.float32), "observed": np.zeros(self.bins + 1, np.int32)}

    def bin_of(self, state) -> np.ndarray:
        """Each prompt's difficulty bin: by its last success rate; `bins` for a prompt never seen."""
        t = state["trials"]
        rate = state["successes"] / np.maximum(t, 1)
        return np.where(t > 0, np.minimum((rate * self.bins).astype(np.int64), self.bins - 1), self.bins)

    def weights(self, state, filled: np.ndarray) -> np.ndarray:
        """q over the bins (0 for empty ones)."""
        corrected = state["score"] / (1 - (1 - self.ema) ** np.maximum(state["observed"], 1))
        score = np.where(state["observed"] > 0, corrected, 1.0)
        w = np.where(filled, np.exp(self.eta * (score - score[filled].max())), 0.0)
        q = (1 - self.explore) * w / w.sum() + self.explore * filled / filled.sum()
        return q / q.sum()

    def choose(self, state, draw):
        rng, n = draw.rng(), draw.prompts
        bins = self.bin_of(state)
        members = [np.flatnonzero(bins == b) for b in range(self.bins + 1)]
        counts = rng.multinomial(n, self.weights(state, np.array([len(m) > 0 for m in members])))
        taken = [rng.choice(m, min(c, len(m)), replace=False) for m, c in zip(members, counts)]
        picked = np.concatenate(taken)
        if len(picked) < n:  # bins drawn more often than they hold prompts: the rest uniformly
            rest = np.setdiff1d(np.arange(draw.size), picked)
            picked = np.concatenate([picked, rng.choice(rest, n - len(picked), replace=False)])
        p = (state["successes"][picked] + 1.0) / (state["trials"][picked] + 2.0)
        slots = sqrt_allocation(np.sqrt(p * (1 - p)), n, self.max_slots)
        return Choice(picked[slots > 0], slots[slots > 0] * draw.group_size)

    def update(self, state, results):
        seen = results.trials > 0
        i, s, t = results.indices[seen], results.successes[seen], results.trials[seen]
        bins = self.bin_of(state)[i]  # the bins they were drawn from
        fails = np.bincount(bins, t - s, self.bins + 1) / np.maximum(np.bincount(bins, t, self.bins + 1), 1)
        hit = np.bincount(bins, minlength=self.bins + 1) > 0
        state = {k: v.copy() for k, v in state.items()}
        state["score"] = np.where(hit, (1 - self.ema) * state["score"] + self.ema * fails, state["score"]).astype(np.float32)
        state["observed"] += hit
        state["successes"][i], state["trials"][i] = s, t
        return state


@sampler("spo", needs_correctness=True, baseline=True, drift=True)
@dataclasses.dataclass(frozen=True)
class SpoTracker(SamplerParams):
    """SPO's value tracker and prioritized sampling (arXiv 2509.13232; the authors' verl recipe). Each
    prompt keeps Beta pseudo-counts (alpha, beta), both `prior` at first; its baseline is
    v = alpha / (alpha + beta), subtracted from its samples' rewards before the `spo` advantage
    standardizes them over the batch. After a round, alpha <- rho alpha + sum r and beta <- rho beta +
    sum (1 - r) over the prompt's samples' weighted total rewards r (for r in [0, 1] a discounted Beta
    posterior; for any r, v is the discounted mean of the rewards, as alpha + beta does not depend on
    them), with rho = clip(2^(-D / `half_drift`), `rho_min`, `rho_max`): the more the policy moved since the prompt was last seen (D), the faster its old
    evidence fades; a prompt never seen has D = 0. D here is the drift the trainer measured after each
    step (mean |log pi_new - log pi_old| over the step's tokens), summed over the steps since the
    prompt's last round; the recipe measures it on the prompt's own last sample instead. Rounds draw
    prompts without replacement with probability proportional to sqrt(v (1 - v)) + `epsilon` (v clipped
    to [0, 1]; by Gumbel top-k): uncertain prompts first, none starved."""

    prior: float = 0.5
    half_drift: float = 0.06
    rho_min: float = 0.875
    rho_max: float = 0.96
    epsilon: float = 0.05

    def __post_init__(self):
        self.check({
            "prior": (self.prior > 0, "must be > 0 (the pseudo-count of successes and of failures at first)"),
            "half_drift": (self.half_drift > 0, "must be > 0 (the drift that halves the weight of old evidence)"),
            "rho_min": (0 <= self.rho_min <= self.rho_max, "must be in [0, rho_max]"),
            "rho_max": (self.rho_max <= 1, "must be <= 1"),
            "epsilon": (self.epsilon > 0, "must be > 0 (every prompt keeps a chance to be drawn)"),
        })

    def init(self, size):
        return {"alpha": np.full(size, self.prior, np.float32), "beta": np.full(size, self.prior, np.float32),
                "seen_at": np.full(size, -1.0, np.float32), "clock": np.zeros(1, np.float32)}

    def baseline(self, state, indices):
        return (state["alpha"] / (state["alpha"] + state["beta"]))[indices]

    def choose(self, state, draw):
        v = np.clip(state["alpha"] / (state["alpha"] + state["beta"]), 0, 1)
        keys = np.log(np.sqrt(v * (1 - v)) + self.epsilon) + draw.rng().gumbel(size=draw.size)
        return Choice(_top(keys, draw.prompts), np.full(draw.prompts, draw.group_size))

    def update(self, state, results):
        seen = results.trials > 0
        i, r, n = results.indices[seen], results.rewards[seen], results.trials[seen]
        state = {k: v.copy() for k, v in state.items()}
        drift = np.where(state["seen_at"][i] >= 0, state["clock"][0] - state["seen_at"][i], 0.0)
        rho = np.clip(2.0 ** (-drift / self.half_drift), self.rho_min, self.rho_max)
        state["alpha"][i] = rho * state["alpha"][i] + r
        state["beta"][i] = rho * state["beta"][i] + (n - r)
        state["seen_at"][i] = state["clock"][0]
        return state

    def observe(self, state, drift):
        return {**state, "clock": (state["clock"] + drift).astype(np.float32)}


@sampler("repo", replays=True)
@dataclasses.dataclass(frozen=True)
class Repo(SamplerParams):
    """RePO (arXiv 2506.09340) with its recency replay strategy: a round draws half as many prompts as it
    has slots (the uniform order, at half the batch); each gets one fresh slot and, once it has a stored
    group (its last sampled one), that group again as a second slot, off-policy (a second fresh slot
    until then). A replayed group keeps advantages of its own, as RePO estimates on- and off-policy
    advantages apart; the repo preset weighs it by token-level truncated importance ratios of the
    policy to the one that sampled it (algorithm.tis_level)."""

    def choose(self, state, draw):
        pairs, single = divmod(draw.prompts, 2)
        indices = batch_indices(draw.size, pairs + single, draw.seed, draw.position)
        slots = np.r_[np.full(pairs, 2), np.ones(single, np.int64)]
        replay = ((slots == 2) & draw.stored[indices]).astype(np.int64)
        return Choice(indices, (slots - replay) * draw.group_size, replay=replay)


@sampler("ar3po", needs_correctness=True, reuse=True)
@dataclasses.dataclass(frozen=True)
class Ar3po(SamplerParams):
    """AR3PO (arXiv 2509.25808), its two techniques within a fixed batch. Adaptive rollout: candidates come
    in the uniform order, and one whose last round had no correct answer gets `hard_slots` slots
    (group_size samples each, one group), the others one, until the round's slots are spent: the
    rollouts go to hard prompts, fewer prompts a round. (The paper samples in stages within a step,
    stopping a prompt at its first correct answer; here a prompt's last round decides.) Response reuse:
    the trainer keeps each prompt's last group with a correct answer, and a fresh group with none takes
    that correct answer in place of its last sample, off-policy (the ar3po preset's token TIS weighs
    it)."""

    hard_slots: int = 2

    def __post_init__(self):
        self.check({"hard_slots": (self.hard_slots >= 1, "must be >= 1 (slots of group_size samples)")})

    def init(self, size):
        return {"hard": np.zeros(size, np.int32)}

    def choose(self, state, draw):
        candidates = batch_indices(draw.size, draw.prompts, draw.seed, draw.position)
        want = np.where(state["hard"][candidates] > 0, self.hard_slots, 1)
        slots = np.minimum(want, np.maximum(draw.prompts - np.cumsum(want) + want, 0))
        return Choice(candidates[slots > 0], slots[slots > 0] * draw.group_size)

    def update(self, state, results):
        seen = results.trials > 0
        hard = state["hard"].copy()
        hard[results.indices[seen]] = results.successes[seen] == 0
        return {"hard": hard}
