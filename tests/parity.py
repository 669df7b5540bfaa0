"What the parity tests share: how far our numbers are from the official code's."
import numpy as np
import torch


def as_array(a) -> np.ndarray:
    "A tensor, list or number as a float64 array (a tensor's own precision kept: no detour through float32)."
    return a.detach().cpu().double().numpy() if torch.is_tensor(a) else np.asarray(a, dtype=float)


def rel(ours, theirs) -> float:
    "Relative difference of two arrays: the largest |ours - theirs| over the largest |theirs|."
    ours, theirs = as_array(ours), as_array(theirs)
    return float(np.abs(ours - theirs).max() / max(np.abs(theirs).max(), 1e-300))
