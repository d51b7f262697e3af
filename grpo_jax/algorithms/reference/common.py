"""What every float64 reference shares: the log-ratio clamp of the library."""

import numpy as np

LOG_RATIO_BOUND = 20.0  # every log-ratio is clamped to +-20 before exp (verl, Tunix)


def exp_clamped(x):
    return np.exp(np.clip(x, -LOG_RATIO_BOUND, LOG_RATIO_BOUND))
