"""An exported checkpoint step is that step's policy in PyTorch `transformers`: the same logits."""

import jax
import numpy as np
import torch
import transformers

from grpo_jax import export, models, run
from test_trainer import config


def test_each_exported_step_gives_its_own_logits_in_transformers(tmp_path):
    cfg = config(tmp_path, steps=2, checkpoint_every=1, keep_checkpoints=2)
    run.train(cfg)
    tokens = np.random.default_rng(0).integers(3, cfg.model.vocab_size, (3, 9))
    seg = np.array([[0] * (9 - n) + [1] * n for n in (9, 5, 2)], np.int32)  # left padded
    pos = np.maximum(np.cumsum(seg, axis=1) - 1, 0).astype(np.int32)
    valid = seg.astype(bool)
    logits = {}
    for step in (1, 2):
        ckpt, _ = export.open_step(cfg, step)
        params = ckpt.restore(None, step)[0]["train"]["params"]  # our policy at this step, as saved
        ckpt.close()
        ours = np.asarray(jax.jit(models.logits, static_argnums=0)(cfg.model, params, tokens, pos, seg))
        hf = transformers.AutoModelForCausalLM.from_pretrained(export.export_step(cfg, step), dtype=torch.float32).eval()
        with torch.no_grad():
            logits[step] = hf(input_ids=torch.tensor(tokens), attention_mask=torch.tensor(seg),
                              position_ids=torch.tensor(pos, dtype=torch.long)).logits.numpy()
        np.testing.assert_allclose(logits[step][valid], ours[valid], atol=1e-4, rtol=0)
    assert np.abs(logits[1] - logits[2])[valid].max() > 1e-3  # two different policies: step 1 is not the final one
