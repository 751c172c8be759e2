// The vector operations of the instruction set the library (or test driver) is built for, chosen
// by its SPECCHAT_ISA_* define: isa/scalar.h says what each operation means lane by lane, and
// every other header does the same per lane, so all of them give the same bits.
#pragma once
#include "core/half.h"

#if defined(SPECCHAT_ISA_AVX512)
#include "isa/avx512.h"
#elif defined(SPECCHAT_ISA_AVXVNNI)
#include "isa/avxvnni.h"
#elif defined(SPECCHAT_ISA_AVX2)
#include "isa/avx2.h"
#elif defined(SPECCHAT_ISA_I8MM)
#include "isa/i8mm.h"
#elif defined(SPECCHAT_ISA_NEON)
#include "isa/neon.h"
#elif defined(SPECCHAT_ISA_SCALAR)
#include "isa/scalar.h"
#else
#error "build with one of -DSPECCHAT_ISA_AVX512, _AVXVNNI, _AVX2, _I8MM, _NEON or _SCALAR"
#endif
