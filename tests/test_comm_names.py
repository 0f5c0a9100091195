"""gpurt.comm takes torch.cuda.comm's parameter names (issue #18), and the names it used
before as keywords too. CPU: the calls fail on their (host) input, after the keywords bound."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

from gpurt import comm

TORCH_NAMES = {  # torch.cuda.comm's signatures (torch 2.x)
    "broadcast": ["tensor", "devices", "out"],
    "broadcast_coalesced": ["tensors", "devices", "buffer_size"],
    "reduce_add": ["inputs", "destination"],
    "reduce_add_coalesced": ["inputs", "destination", "buffer_size"],
    "scatter": ["tensor", "devices", "chunk_sizes", "dim", "streams", "out"],
    "gather": ["tensors", "dim", "destination", "out"],
}


@pytest.mark.parametrize("name", sorted(TORCH_NAMES))
def test_parameter_names_are_torchs(name: str) -> None:
    assert list(inspect.signature(getattr(comm, name)).parameters) == TORCH_NAMES[name]


@pytest.mark.parametrize("call", [
    lambda: comm.broadcast(tensor=np.zeros(3), devices=[0]),
    lambda: comm.broadcast(array=np.zeros(3), devices=[0]),
    lambda: comm.scatter(tensor=np.zeros(3), devices=[0]),
    lambda: comm.scatter(array=np.zeros(3), devices=[0]),
    lambda: comm.gather(tensors=[np.zeros(3)]),
    lambda: comm.gather(arrays=[np.zeros(3)]),
    lambda: comm.broadcast_coalesced(tensors=[np.zeros(3)], devices=[0]),
])
def test_keywords_bind(call) -> None:
    with pytest.raises(Exception) as caught:  # noqa: PT011 (any error after binding)
        call()
    assert "keyword" not in str(caught.value)  # bound: the input itself is what is refused
    assert "device array" in str(caught.value) or "driver" in str(caught.value)


def test_old_and_new_names_together_are_refused() -> None:
    with pytest.raises(TypeError, match="both array= and tensor="):
        comm.broadcast(array=1, tensor=2, devices=[0])
