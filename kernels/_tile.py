"""Tile-level math shared by the chunked jnp path and the Pallas kernels (one copy of each formula).

A tile is `h` [tn, d] against a vocabulary slice `w` ([d, tv], or [tv, d] when `transposed`).
Logits are z = h @ w / T in float32. Forward keeps per row a running max `m`, s = sum exp(z - m)
and u = sum exp(z - m) (z - m) (online log-sum-exp and online entropy), so that
lse = m + log s, E_p[z] = m + u / s and H = lse - E_p[z]. The target's logit is a row-wise dot
with its gathered column of w, not one more pass over every [tn, tv] tile.
"""

import jax
import jax.numpy as jnp

# A finite "minus infinity" for the running max: keeps (m_old - m_new) * s at 0 * finite = 0.
NEG = -1e30


def logits(h, w, inv_temp: float, transposed: bool):
    """[tn, tv] float32 logits of one tile; bf16 inputs accumulate in float32."""
    dims = (((1,), (1,)), ((), ())) if transposed else (((1,), (0,)), ((), ()))
    return jax.lax.dot_general(h, w, dims, preferred_element_type=jnp.float32) * inv_temp


def grad_hidden(dz, w, transposed: bool):
    """dz [tn, tv] @ w^T -> [tn, d] float32."""
    dims = (((1,), (0,)), ((), ())) if transposed else (((1,), (1,)), ((), ()))
    return jax.lax.dot_general(dz.astype(w.dtype), w, dims, preferred_element_type=jnp.float32)


def grad_unembed(h, dz, transposed: bool):
    """h^T @ dz in w's layout: [d, tv], or [tv, d] when transposed; float32."""
    dz = dz.astype(h.dtype)
    if transposed:
        return jax.lax.dot_general(dz, h, (((0,), (0,)), ((), ())), preferred_element_type=jnp.float32)
    return jax.lax.dot_general(h, dz, (((0,), (0,)), ((), ())), preferred_element_type=jnp.float32)


def target_logits(h, w_t, inv_temp: float, transposed: bool):
    """[tn, 1] float32 logits of each row's target; `w_t` holds the rows' target columns of w in
    w's layout ([d, tn], or [tn, d] when transposed)."""
    dims = (((1,), (1,)), ((0,), (0,))) if transposed else (((1,), (0,)), ((0,), (1,)))
    return jax.lax.dot_general(h, w_t, dims, preferred_element_type=jnp.float32)[:, None] * inv_temp


def init_stats(tn: int):
    """(m, s, u), each [tn, 1], before any tile."""
    zeros = jnp.zeros((tn, 1), jnp.float32)
    return jnp.full((tn, 1), NEG, jnp.float32), zeros, zeros


def update_stats(stats, z, valid=None):
    """Fold one tile into the running stats ([tn, 1] each). `valid` [tn, tv] marks the columns to
    count (None: all)."""
    m, s, u = stats
    if valid is not None:
        z = jnp.where(valid, z, NEG)  # adds exp(NEG - m) = 0 to s and 0 * finite to u
    m_new = jnp.maximum(m, jnp.max(z, axis=-1, keepdims=True))
    shifted = z - m_new
    e = jnp.exp(shifted)
    scale = jnp.exp(m - m_new)
    s_new = s * scale + e.sum(-1, keepdims=True)
    u_new = (u + (m - m_new) * s) * scale + (e * shifted).sum(-1, keepdims=True)
    return m_new, s_new, u_new


def finish_stats(stats):
    """Running stats -> (lse, E_p[z]), each [tn, 1] float32."""
    m, s, u = stats
    return m + jnp.log(s), m + u / s


def dlogits(z, lse, ez, g_logp, g_ent, valid, hit, inv_temp: float):
    """Cotangent of the pre-temperature logits h @ w for one tile, [tn, tv] float32; the
    per-row inputs (lse, ez, g_logp, g_ent) are [tn, 1].

    d logp_t / dz = onehot(t) - p and dH / dz = p (E_p[z] - z); columns not `valid` get zero
    (None: all are valid). `g_ent` is None when the entropy is not an output."""
    p = jnp.exp(z - lse)
    dz = g_logp * (hit.astype(jnp.float32) - p)
    if g_ent is not None:
        dz = dz + g_ent * p * (ez - z)
    return (dz if valid is None else jnp.where(valid, dz, 0.0)) * inv_temp
