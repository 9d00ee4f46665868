"""CPU targets for interleaved Q4_0: which layout each runs fastest, and the compiler flags
that build our kernels for it. `ggml-ext repack --target NAME` reads this table;
docs/ARM.md explains it and tests/kernels/test_targets.py compiles the kernel library with every
flag set listed here and checks which implementations each one compiles in.

A build runs the kernels its target flags enable (ggml_ext/src/common/simd.h);
any layout runs on any build, through the best compiled-in kernel (the scalar reference at
worst), so a file repacked for the wrong target is slower, never wrong.
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Target", "TARGETS", "target"]


@dataclass(frozen=True)
class Target:
    name: str
    cpus: str                 # the CPUs it stands for
    layout: str               # repack --layout value
    why: str
    arch: str                 # Arm: the -march value (GGML_CPU_ARM_ARCH); x86: the -march value
    extra: tuple[str, ...] = ()   # further compiler flags (x86 only)
    mcpu: str | None = None   # GCC's -mcpu name, where there is one, as an alternative to arch
    kernels: tuple[str, ...] = ()  # our implementations these flags compile in (generic first)

    @property
    def arm(self) -> bool:
        return not self.name.startswith("x86")

    @property
    def cflags(self) -> tuple[str, ...]:
        return (f"-march={self.arch}", *self.extra)

    @property
    def cmake_defines(self) -> tuple[str, ...]:
        """What to pass to `pip install .` (as -C cmake.define.X) for a build for this target."""
        if self.arm:
            return ("GGML_EXT_NATIVE=OFF", f"GGML_CPU_ARM_ARCH={self.arch}")
        opts = ["GGML_EXT_NATIVE=OFF", "GGML_AVX=ON", "GGML_AVX2=ON", "GGML_FMA=ON", "GGML_F16C=ON", "GGML_BMI2=ON"]
        if "-mavx512vnni" in self.extra:
            opts += ["GGML_AVX512=ON", "GGML_AVX512_VNNI=ON"]
        return tuple(opts)


_NEON = ("generic", "neon-dotprod")
_I8MM = (*_NEON, "neon-i8mm")
_SVE = (*_I8MM, "sve256-i8mm")

TARGETS: dict[str, Target] = {t.name: t for t in (
    Target("graviton2", "AWS Graviton2 (Neoverse N1)", "4x4",
           "dotprod, no i8mm: SDOT by lane on 4-byte chunks", "armv8.2-a+dotprod+fp16", mcpu="neoverse-n1",
           kernels=_NEON),
    Target("graviton3", "AWS Graviton3 (Neoverse V1)", "8x8",
           "SVE with 256-bit vectors and i8mm: one SVE SMMLA does 64 MACs on an 8x8 block",
           "armv8.4-a+sve+i8mm+bf16+fp16", mcpu="neoverse-v1", kernels=_SVE),
    Target("graviton4", "AWS Graviton4 (Neoverse V2)", "4x8",
           "i8mm, but SVE2 with 128-bit vectors: NEON SMMLA, where 4x8 needs fewest instructions",
           "armv9-a+i8mm+bf16", kernels=_SVE),  # -mcpu=neoverse-v2 needs GCC 13+
    Target("phone-dotprod", "Cortex-A55, A75, A76, A77, A78, X1 (Snapdragon 845-888, Tensor G1)", "4x4",
           "dotprod, no i8mm", "armv8.2-a+dotprod+fp16", mcpu="cortex-a76", kernels=_NEON),
    Target("phone-i8mm", "Cortex-A510, A710, A715, A720, X2, X3, X4 (Snapdragon 8 Gen 1+, Tensor G2+)", "4x8",
           "i8mm; SVE2 is 128-bit on these cores, so NEON SMMLA", "armv8.6-a+dotprod+i8mm+fp16", mcpu="cortex-a710",
           kernels=_I8MM),
    Target("apple-m1", "Apple M1 (and A14)", "4x4", "dotprod, no i8mm", "armv8.4-a+dotprod+fp16", kernels=_NEON),
    Target("apple-m2", "Apple M2, M3, M4 (and A15+)", "4x8", "i8mm, no SVE", "armv8.6-a+dotprod+i8mm+fp16",
           kernels=_I8MM),
    Target("x86-avx2", "x86-64 with AVX2 (Haswell+, Zen 1+)", "8x8",
           "8-byte chunks of 8 rows fill a 32-byte register", "x86-64-v3", kernels=("generic", "avx2")),
    Target("x86-avx512", "x86-64 with AVX-512 VNNI (Ice Lake+, Zen 4+)", "8x8",
           "a 64-byte register holds half an 8x8 block; vpdpbusd", "x86-64-v4", extra=("-mavx512vnni",),
           kernels=("generic", "avx2", "avx512-vnni")),
)}


def target(name: str) -> Target:
    try:
        return TARGETS[name.lower()]
    except KeyError:
        raise ValueError(f"unknown target {name!r}; choose from {', '.join(TARGETS)}") from None
