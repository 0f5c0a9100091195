import time, statistics, torch, gpurt
from gpurt._array import interop
from gpurt import array as A
from gpurt._core.state import current_place
def us(fn, n=3000):
    s=[]
    for _ in range(5):
        t0=time.perf_counter()
        for _ in range(n): fn()
        s.append((time.perf_counter()-t0)/n*1e6)
    return round(statistics.median(s),3)
t = torch.randn(97, 4099, device="cuda")
print("place before", current_place())
print("view fn", interop.view, "reader", interop._reader)
x = gpurt.asarray(t)
print("place after", current_place())
print("view fn", interop.view, "reader", interop._reader)
print("view(t) ->", type(interop.view(t)))
print("torch_fields ->", interop.torch_fields(t, None))
for name, fn in {"interop.view": lambda: interop.view(t), "torch_fields": lambda: interop.torch_fields(t, None),
                 "_device_view": lambda: A._device_view(t, None), "asarray": lambda: gpurt.asarray(t),
                 "describe": lambda: interop.describe(t, None), "Array del": lambda: A._make(1, (1,), (4,), x.dtype, x.device, None, t, True),
                 "current_place": current_place}.items():
    print(f"{name:16s}", us(fn))
import cProfile, pstats
cProfile.run("for _ in range(3000): gpurt.asarray(t)", "/tmp/p.out")
pstats.Stats("/tmp/p.out").sort_stats("tottime").print_stats(15)
