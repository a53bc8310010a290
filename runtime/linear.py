"""Linear layers with weights prepacked for oneDNN, the fastest matmul this runtime has on CPU.

Decoding multiplies a few rows by large weight matrices, so it is bound by reading the weights. The
default path (MKL, weights in PyTorch's layout) reaches about a third of this machine's memory
bandwidth and grows with the number of rows; oneDNN on weights reordered once into its blocked layout
reads them about twice as fast, and up to about 8 rows cost what one row costs (beyond ~12 rows two
cores become compute bound). The results differ from F.linear only in summation order (about 1e-6
relative in float32).
"""

import torch
import torch.nn.functional as F

ROWS_HINT = 64  # the batch oneDNN tunes its layout for; measured as good for 1 to 64 rows


def _packing_available(dtype: torch.dtype) -> bool:
    return (dtype == torch.float32 and torch.backends.mkldnn.is_available()
            and hasattr(torch.ops.mkldnn, "_reorder_linear_weight"))


class Linear:
    """y = x W^T for x [T, in] and W [out, in]; prepacked when oneDNN supports the dtype."""

    def __init__(self, weight: torch.Tensor, pack: bool = True):
        self.out_features, self.in_features = weight.shape
        self.packed = pack and _packing_available(weight.dtype)
        if self.packed:
            self.weight = torch.ops.mkldnn._reorder_linear_weight(weight.contiguous(), ROWS_HINT)
        else:
            self.weight = weight

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """[..., in] -> [..., out]."""
        if not self.packed:
            return F.linear(x, self.weight)
        rows = x.reshape(-1, self.in_features)  # oneDNN takes 2-D inputs
        y = torch.ops.mkldnn._linear_pointwise(rows, self.weight, None, "none", [], "")
        return y.reshape(*x.shape[:-1], self.out_features)
