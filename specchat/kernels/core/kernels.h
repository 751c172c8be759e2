// The packed matrices' kernels, free of torch, one header per phase of a product:
//   core/quant.h   the input rows quantized to int8 per row (QuantRows);
//   core/blocks.h  the block kernels: a tile of rows times one channel block of a q4, q5, q6, q8,
//                  f16 or f32 matrix, the integer sums formed by the instruction set's dot unit;
//   core/matrix.h  the matrix driver: Matrix, run_group (channel blocks spread over threads
//                  through the `parallel_for` the includer defines: ATen's pool in qgemm.cpp, the
//                  test driver's own loop) and dequantize_row.
// The packed layout: core/layout.h; why every row is exact: qgemm.cpp's header. The vector
// operations: core/isa.h picks one header of isa/.
//
// Words, one meaning each:
//   channel block  16 output channels, one lane each (core/layout.h)
//   quad           four consecutive inputs of a channel: the 4 bytes one 32-bit lane of weights
//                  holds, what dpbusd and sdot multiply at once
//   octet          two quads, eight consecutive inputs: a dot unit's step (D::Octet)
//   group          16 or 32 inputs sharing a scale; super-block: S inputs sharing d (and dm)
//   part           a register's worth of a channel block's channels (D::PARTS: 1 on AVX-512, 2
//                  on AVX2, 4 on NEON)
//   unit           the rows a dot unit takes at once (D::ROWS: one, or two on i8mm, which reads
//                  them interleaved: QuantRows::interleaved)
//   tile           the rows of one pass over a channel block's weights (at most 8)
//   pair           two values an instruction multiplies by two others and adds into one wider
//                  lane (maddubs: int8 products into int16; madd and dpwssd: int16 into int32);
//                  isa's Pairs hold two groups' factors so, for p_dot
//
// Everything here has internal linkage: each variant's library (and each driver) holds its own
// copy, so several variants loaded in one process never see each other's symbols.
#pragma once
#include "core/quant.h"
#include "core/blocks.h"
#include "core/matrix.h"
