"""The GSPO paper's GRPO baseline (arXiv 2507.18071, sec. 5.1): `gspo.py`'s run with GRPO's objective.

The paper's GRPO: token-level ratios clipped to [1 - 0.2, 1 + 0.27] (its Eq. 2; the grpo preset's
group-normalized advantages and per-sequence token mean), no KL term, and Routing Replay: "GRPO
necessitates the Routing Replay training strategy for the normal convergence of MoE RL" (sec. 5.1,
5.3), i.e. the experts recorded when l^old is computed are replayed in every update of the rollout
batch (algorithm.routing_replay="old"). Everything else (model, data, batch, minibatches, optimizer,
mesh) is the GSPO arm's; see gspo.py for what the paper states and what it leaves open.
"""

import dataclasses

from experiments.configs.gspo_paper import gspo
from grpo_jax import algorithms
from grpo_jax.algorithms.losses import PpoClip
from grpo_jax.config import Config


def get_config() -> Config:
    cfg = gspo.get_config()
    return dataclasses.replace(
        cfg,
        algorithm=algorithms.AlgorithmConfig.from_preset("grpo", beta=0.0, loss=PpoClip(eps_high=0.27),
                                                         routing_replay="old"),
        train=dataclasses.replace(cfg.train, out_dir="runs/gspo_paper/grpo"),
    )
