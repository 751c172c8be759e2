"""Compile each batch-invariant Triton kernel for the H200's sm_90, printing one line per program.

Run by tests/kernels/test_invariant.py in a child process with TRITON_INTERPRET=0: a process that
imported Triton for its interpreter cannot lower kernels to machine code.
"""

# ruff: noqa: E501 (the kernel signatures read best one per line)

from __future__ import annotations

from typing import Any

from triton import compile as triton_compile
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from specchat.kernels import invariant


def cases(dt: str) -> list[tuple[Any, dict[str, str], dict[str, Any]]]:
    """(kernel, signature, constants) for each program at one activation dtype, at the 1.5B's shapes."""
    matmul, sum_splits = invariant._matmul_programs()
    rms, softmax = invariant._row_programs()
    attention = invariant._attention_program()
    i32 = "i32"
    return [
        (
            matmul,
            {"x_ptr": f"*{dt}", "w_ptr": f"*{dt}", "out_ptr": "*fp32", "M": i32, "N": i32, "K": i32,
             "stride_xm": i32, "stride_wn": i32, "stride_os": i32, "stride_om": i32},
            {"K_PER_SPLIT": 192, "BM": invariant.BLOCK_M, "BN": invariant.BLOCK_N, "BK": invariant.BLOCK_K},
        ),
        (
            sum_splits,
            {"part_ptr": "*fp32", "bias_ptr": f"*{dt}", "out_ptr": f"*{dt}", "M": i32, "N": i32},
            {"SPLITS": 8, "HAS_BIAS": True, "BN": 256},
        ),
        (rms, {"x_ptr": f"*{dt}", "out_ptr": "*fp32", "stride": i32, "eps": "fp32"}, {"H": 1536, "BLOCK": 1024}),
        (softmax, {"x_ptr": f"*{dt}", "out_ptr": "*fp32", "stride": i32}, {"V": 151936, "BLOCK": 2048}),
        (
            attention,
            {"q_ptr": f"*{dt}", "k_ptr": f"*{dt}", "v_ptr": f"*{dt}", "first_ptr": "*i32", "last_ptr": "*i32",
             "out_ptr": f"*{dt}", "scale": "fp32", "stride_qh": i32, "stride_qm": i32, "stride_kh": i32,
             "stride_kn": i32, "stride_vh": i32, "stride_vn": i32, "stride_oh": i32, "stride_om": i32},
            {"C": 1024, "GROUPS": 6, "D": 128, "BLOCK": invariant.ATTENTION_BLOCK},
        ),
    ]  # fmt: skip


def main() -> None:
    for dt in ("bf16", "fp32"):
        for kernel, signature, constants in cases(dt):
            signature = {**signature, **dict.fromkeys(constants, "constexpr")}
            compiled = triton_compile(
                ASTSource(fn=kernel, signature=signature, constexprs=constants),
                target=GPUTarget("cuda", 90, 32),
            )
            print("compiled", kernel.__name__, dt, len(compiled.asm["cubin"]))


if __name__ == "__main__":
    main()
