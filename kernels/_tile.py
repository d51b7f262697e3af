"""Tile-level math shared by the chunked jnp path and the Pallas kernels (one copy of each formula).

A tile is `h` [tn, d] against a vocabulary slice `w` ([d, tv], or [tv, d] when `transposed`).
Logits are z = h @ w / T in float32. Forward keeps per row a running max `m`, s = sum exp(z - m)
and u = sum exp(z - m) (z - m) (online log-sum-exp and online entropy), so that
lse = m + log s, E_p[z] = m + u / s and H = lse - E_p[z].
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


def init_stats(tn: int):
    """(m, s, u, z_target), each [tn, 1], before any tile."""
    zeros = jnp.zeros((tn, 1), jnp.float32)
    return jnp.full((tn, 1), NEG, jnp.float32), zeros, zeros, zeros


def update_stats(stats, z, valid, hit):
    """Fold one tile into the running stats ([tn, 1] each). `valid` [tn, tv] marks columns counted in this tile
    (in range and not seen in an earlier tile); `hit` [tn, tv] marks each row's target column."""
    m, s, u, zt = stats
    m_new = jnp.maximum(m, jnp.max(jnp.where(valid, z, NEG), axis=-1, keepdims=True))
    shifted = jnp.where(valid, z - m_new, 0.0)
    e = jnp.where(valid, jnp.exp(shifted), 0.0)
    scale = jnp.exp(m - m_new)
    s_new = s * scale + e.sum(-1, keepdims=True)
    u_new = (u + (m - m_new) * s) * scale + (e * shifted).sum(-1, keepdims=True)
    zt_new = zt + jnp.where(valid & hit, z, 0.0).sum(-1, keepdims=True)
    return m_new, s_new, u_new, zt_new


def finish_stats(stats):
    """Running stats -> (lse, E_p[z], z_target), each [tn, 1] float32."""
    m, s, u, zt = stats
    return m + jnp.log(s), m + u / s, zt


def dlogits(z, lse, ez, g_logp, g_ent, valid, hit, inv_temp: float):
    """Cotangent of the pre-temperature logits h @ w for one tile, [tn, tv] float32; the
    per-row inputs (lse, ez, g_logp, g_ent) are [tn, 1].

    d logp_t / dz = onehot(t) - p and dH / dz = p (E_p[z] - z); invalid columns get zero.
    `g_ent` is None when the entropy is not an output."""
    p = jnp.exp(z - lse)
    dz = g_logp * (hit.astype(jnp.float32) - p)
    if g_ent is not None:
        dz = dz + g_ent * p * (ez - z)
    return jnp.where(valid, dz, 0.0) * inv_temp
