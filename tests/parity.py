"What the parity tests share: how far our numbers are from the official code's, and the tolerance that float64 allows."
import numpy as np
import torch

RTOL = 1e-12   # float64 arithmetic in a different order (ours against the official code) agrees to ~1e-15; 1e-12 leaves room


def as_array(a) -> np.ndarray:
    "A tensor, list or number as a float64 array (a tensor's own precision kept: no detour through float32)."
    return a.detach().cpu().double().numpy() if torch.is_tensor(a) else np.asarray(a, dtype=float)


def rel(ours, theirs) -> float:
    "Relative difference of two arrays: the largest |ours - theirs| over the largest |theirs|."
    ours, theirs = as_array(ours), as_array(theirs)
    return float(np.abs(ours - theirs).max() / max(np.abs(theirs).max(), 1e-300))


def assert_parity(ours, theirs, rtol: float = RTOL):
    """Element by element: |ours - theirs| <= rtol |theirs| + rtol max|theirs| (the absolute floor, for elements that
    are zero or cancel to rounding noise, is rtol times the array's largest element; 1e-300 for an all-zero array)."""
    ours, theirs = as_array(ours), as_array(theirs)
    assert ours.shape == theirs.shape, f"shape {ours.shape} against the official {theirs.shape}"
    np.testing.assert_allclose(ours, theirs, rtol=rtol, atol=rtol * max(np.abs(theirs).max(initial=0.0), 1e-300))
