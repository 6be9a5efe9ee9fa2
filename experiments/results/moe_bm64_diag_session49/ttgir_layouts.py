import json, re, sys
sys.path.insert(0, "/work/main")
import experiments.ptx_stats as ps
from triton.backends.compiler import GPUTarget
from triton.compiler import compile as triton_compile
for item in json.load(open(sys.argv[1] if len(sys.argv) > 1 else "/tmp/manifest.json")):
    src = ps._raw_source(item)
    k = triton_compile(src, target=GPUTarget("cuda", 90, 32),
                       options={"num_warps": item["num_warps"], "num_stages": item["num_stages"]})
    g = k.asm["ttgir"]
    open(f"/tmp/{item['key'].replace(' ', '_').replace('=', '')}.ttgir", "w").write(g)
    asm_lines = [ln.strip() for ln in g.splitlines() if "elementwise_inline_asm" in ln]
    print(item["key"], "wgmma:", k.asm["ptx"].count("wgmma.mma_async"), "mma.sync:", k.asm["ptx"].count("mma.sync"))
    for ln in asm_lines[:3]:
        print("   ", re.sub(r'asm_string = "[^"]*"', 'asm_string=...', ln)[-260:])
    print("   layouts:", sorted(set(re.findall(r"#\w+ = #ttg\.\w+<[^>]*>", g)))[:8])
