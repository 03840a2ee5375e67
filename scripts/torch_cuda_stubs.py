"""Stub CUDA libraries, so that a CUDA build of PyTorch (the PyPI wheel for Linux x86-64,
installed with --no-deps) imports and runs on CPU without its NVIDIA wheels, which take
several GiB of disk.

Each stub has the soname and the symbol versions torch's libraries ask for, and defines
every symbol they import from it as a function returning 100 (cudaErrorNoDevice), or,
for the functions that name an error, a text saying there is no device: torch
sees no GPU (torch.cuda.is_available() is False) and nothing CUDA runs. Used by
scripts/torch-venv.sh where the CPU wheel index cannot be reached and there is no NVIDIA
GPU (or the disk is short); needs `readelf` (binutils) and a C compiler.

Usage: python scripts/torch_cuda_stubs.py SITE_PACKAGES OUT_DIR
       OUT_DIR on torch's rpath (SITE_PACKAGES/nvidia/cu13/lib) needs nothing more; any
       other directory needs LD_LIBRARY_PATH=OUT_DIR
"""

import os
import re
import subprocess
import sys

# The NVIDIA libraries the CUDA wheel links against.
CUDA = re.compile(
    r"^lib(cuda|cudart|cublas|cublasLt|cudnn|cusparse|cusparseLt|cufft|cufile|nccl|nvrtc|cupti"
    r"|cusolver|curand|nvJitLink|nvshmem_host|nvToolsExt)\.so"
)

# An import without a symbol version -> the library its prefix names (longest first).
UNVERSIONED = re.compile(
    r"^(?:(?P<cusparseLt>cusparseLt)|(?P<cublasLt>cublasLt)|(?P<nccl>nccl|pnccl)|(?P<cufile>cuFile)"
    r"|(?P<nvshmem_host>nvshmem)|(?P<cudart>cuda)|(?P<cublas>cublas)|(?P<cudnn>cudnn)|(?P<cufft>cufft)"
    r"|(?P<cusolver>cusolver)|(?P<cusparse>cusparse)|(?P<nvrtc>nvrtc)|(?P<cupti>cupti|Cupti)"
    r"|(?P<curand>curand)|(?P<cuda>cu[A-Z]))\w*$"
)


def readelf(*args):
    return subprocess.run(["readelf", "-W", *args], check=True, capture_output=True, text=True).stdout


def imports(files):
    """soname -> {symbol version -> symbols} of the CUDA libraries `files` import from."""
    needed, unversioned = {}, {}
    for f in files:
        for soname in re.findall(r"\(NEEDED\)\s+Shared library: \[(.+?)\]", readelf("-d", f)):
            if CUDA.match(soname):
                needed.setdefault(soname, {})
        owner, current = {}, None  # symbol version -> the library that defines it
        for line in readelf("-V", f).split(".gnu.version_r")[-1].splitlines():
            if m := re.search(r"File: (\S+)", line):
                current = m.group(1)
            elif m := re.search(r"Name: (\S+)", line):
                owner[m.group(1)] = current
        for line in readelf("--dyn-syms", f).splitlines():
            parts = line.split()
            if len(parts) < 8 or parts[6] != "UND":
                continue
            name, _, version = parts[7].partition("@")
            version = version.lstrip("@")
            lib = owner.get(version)
            if lib and CUDA.match(lib):
                needed.setdefault(lib, {}).setdefault(version, set()).add(name)
            elif not version and (m := UNVERSIONED.match(name)):
                unversioned.setdefault(m.lastgroup, set()).add(name)
    cudart = next((n for n in needed if n.startswith("libcudart.so.")), "libcudart.so.13")
    for group, syms in unversioned.items():
        lib = next((n for n in needed if n.startswith(f"lib{group}.so")), cudart)
        versions = needed.setdefault(lib, {})
        versions.setdefault(min(versions) if versions else lib, set()).update(syms)
    return needed


# The functions that return an error's name or description as a string (torch passes
# cudaGetErrorString's answer to strlen when a CUDA call fails): they return this text.
STRING = re.compile(r"Get(Error|Status)(String|Name)$")


def stub(sym):
    if STRING.search(sym):
        return f'const char* {sym}(void) {{ return "no CUDA device (a stub CUDA library)"; }}\n'
    return f"int {sym}(void) {{ return 100; }}\n"


def main(site, out):
    torch_dir = os.path.join(site, "torch")
    libdir = os.path.join(torch_dir, "lib")
    files = [os.path.join(libdir, f) for f in os.listdir(libdir) if ".so" in f]
    files += [os.path.join(torch_dir, f) for f in os.listdir(torch_dir) if f.endswith(".so")]
    os.makedirs(out, exist_ok=True)
    for soname, versions in sorted(imports(files).items()):
        base = os.path.join(out, soname)
        with open(base + ".c", "w") as c:
            for syms in versions.values():
                for sym in sorted(syms):
                    c.write(stub(sym))
        with open(base + ".map", "w") as m:
            nodes = sorted(versions.items()) or [(soname, set())]
            for i, (version, syms) in enumerate(nodes):
                exported = " global:" + "".join(f" {x};" for x in sorted(syms)) if syms else ""
                m.write(f"{version} {{{exported}{' local: *;' if i == 0 else ''} }};\n")
        subprocess.run(
            ["cc", "-shared", "-fPIC", "-w", "-o", base, f"-Wl,-soname,{soname}",
             f"-Wl,--version-script={base}.map", base + ".c"],
            check=True,
        )
        os.remove(base + ".c")
        os.remove(base + ".map")
        print(f"stub {soname}: {sum(map(len, versions.values()))} symbols")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    main(sys.argv[1], sys.argv[2])
