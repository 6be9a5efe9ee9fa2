"""Run the raw Triton MoE kernels under TRITON_INTERPRET=1 (bits route) against make_case.py goldens. Usage: python run_interp.py REPO_ROOT case.npz... (a Python with torch and triton 3.6)."""
import os, sys, ast, types, importlib.util
os.environ["TRITON_INTERPRET"] = "1"
import numpy as np, torch, triton
ROOT = sys.argv[1]
for name in ("pallas_kernels", "pallas_kernels.moe"):      # enter the packages without their JAX __init__
    sys.modules[name] = types.ModuleType(name)
    sys.modules[name].__path__ = [os.path.join(ROOT, *name.split("."))]
spec = importlib.util.spec_from_file_location("tk", f"{ROOT}/pallas_kernels/moe/_triton_kernels.py")
tk = importlib.util.module_from_spec(spec); spec.loader.exec_module(tk)

def t16(a, dt):
    return torch.from_numpy(a.astype(np.uint16).view(np.int16)).view(dt)

def rel(a, b):
    a = np.asarray(a, np.float64); return np.linalg.norm(a - b) / np.linalg.norm(b)

fails = 0
for case in sys.argv[2:]:
    z = np.load(case)
    act = {"float16": torch.float16, "float32": torch.float32}[str(z["act"])]
    sdt = {"float16": torch.float16, "bfloat16": torch.bfloat16}[str(z["scale"])]
    x = t16(z["x"], act) if act != torch.float32 else torch.from_numpy(z["x"])
    bm, mb, d, i, k = int(z["bm"]), int(z["min_bm"]), int(z["d"]), int(z["i"]), int(z["top_k"])
    row_slot, be = torch.from_numpy(z["row_slot"]), torch.from_numpy(z["block_expert"])
    n = z["h"].shape[0]
    W = {nm: torch.from_numpy(z[f"{nm}_qweight"]) for nm in ("gate", "up", "down")}
    S = {nm: t16(z[f"{nm}_qscale"], sdt) for nm in ("gate", "up", "down")}
    kw_up, kw_dn = W["gate"].shape[1], W["down"].shape[1]
    for scale_w in (True, False):
        for m_min in sorted({0, mb}):
            bn = 32
            h = torch.full((n, i), float("nan"), dtype=torch.float32)
            tk.gate_up[(be.shape[0], i // bn)](row_slot, be, x, x, W["gate"], S["gate"], W["up"], S["up"], h, h,
                D=d, N=i, KW=kw_up, TOP_K=k, NUM_SLOTS=n, BM=bm, MIN_BM=m_min, BN=bn, INT4=True, ASM=False,
                SCALE_W=scale_w, SCALED=False)
            hin = torch.from_numpy(z["h"].astype(np.float32)).to(act)
            y = torch.full((n, d), float("nan"), dtype=torch.float32)
            tk.down[(be.shape[0], d // bn)](row_slot, torch.from_numpy(z["w"]), be, hin, W["down"], S["down"], y, y,
                I=i, N=d, KW=kw_dn, NUM_SLOTS=n, BM=bm, MIN_BM=m_min, BN=bn, INT4=True, ASM=False, SCALE_W=scale_w)
            eh, ey = rel(h.numpy(), z["h"]), rel(y.numpy(), z["y"])
            ok = np.isfinite(h.numpy()).all() and np.isfinite(y.numpy()).all() and eh < 3e-3 and ey < 3e-3
            fails += not ok
            print(os.path.basename(case), "scale_w", scale_w, "min_bm", m_min, "h err %.1e y err %.1e" % (eh, ey), "ok" if ok else "FAIL")
print("fails", fails)
