// Ascend's saturation rule (lsexp.saturation) as CPU kernels for MindSpore's aot Custom
// operators: on a float16, bfloat16 or float32 tensor's bits, an inf becomes the type's largest finite
// value with its sign and a NaN becomes +0; every other value passes bit for bit. MindSpore's CPU
// nan_to_num walks float16 one value at a time; these are one branch-free pass the compiler vectorises.
//
//   Saturate(x) -> x saturated
//   Nonfinite(y, dout) -> float32[1]: 1 when y or dout holds an inf or a NaN, else 0
//   SaturateFlag(y, dout) -> (dout saturated, Nonfinite(y, dout)): a tap's backward in one kernel
//   SaturateAsHalf(g), SaturateAsBfloat(g) -> g saturated at float16's (bfloat16's) largest value when
//     g is float32: a parameter gradient that a float16 (bfloat16) operation made; else Saturate(g)
//
// Built by lsexp.native with the machine's C++ compiler; the ABI is MindSpore's aot one.

#include <cstdint>
#include <cstring>

namespace {

struct Format {
  uint32_t exponent, mantissa, sign, top;  // masks, and the largest finite value's magnitude bits
};

constexpr Format kHalf{0x7C00u, 0x03FFu, 0x8000u, 0x7BFFu};
constexpr Format kBfloat{0x7F80u, 0x007Fu, 0x8000u, 0x7F7Fu};
constexpr Format kSingle{0x7F800000u, 0x007FFFFFu, 0x80000000u, 0x7F7FFFFFu};

int64_t Count(int ndim, const int64_t *shape) {
  int64_t n = 1;
  for (int i = 0; i < ndim; ++i) n *= shape[i];
  return n;
}

// 0 for a type the kernels do not read; then the kernel fails and MindSpore reports it.
int Width(const char *dtype, Format *format) {
  if (std::strcmp(dtype, "float16") == 0) return *format = kHalf, 16;
  if (std::strcmp(dtype, "bfloat16") == 0) return *format = kBfloat, 16;
  if (std::strcmp(dtype, "float32") == 0) return *format = kSingle, 32;
  return 0;
}

template <typename U>
bool SaturateBits(const U *in, U *out, int64_t n, const Format &f) {
  const U exponent = U(f.exponent), mantissa = U(f.mantissa), sign = U(f.sign), top = U(f.top);
  U seen = 0;
  for (int64_t i = 0; i < n; ++i) {
    const U b = in[i];
    const U special = U(0) - U((b & exponent) == exponent);  // all ones for inf and NaN
    const U nan = U(0) - U((b & mantissa) != 0);
    const U saturated = ((b & sign) | top) & ~nan;
    out[i] = (b & ~special) | (saturated & special);
    seen |= special;
  }
  return seen != 0;
}

template <typename U>
bool SpecialBits(const U *in, int64_t n, const Format &f) {
  const U exponent = U(f.exponent);
  U seen = 0;
  for (int64_t i = 0; i < n; ++i) seen |= U(0) - U((in[i] & exponent) == exponent);
  return seen != 0;
}

// -1 when the type is not read; else whether a value was an inf or a NaN. top32: a float32 input's
// largest value's bits, where that is another type's.
int Saturated(void *in, void *out, int64_t n, const char *dtype, uint32_t top32 = kSingle.top) {
  Format f{};
  const int width = Width(dtype, &f);
  if (width == 32) f.top = top32;
  if (width == 16) return SaturateBits(static_cast<const uint16_t *>(in), static_cast<uint16_t *>(out), n, f);
  if (width == 32) return SaturateBits(static_cast<const uint32_t *>(in), static_cast<uint32_t *>(out), n, f);
  return -1;
}

int Special(void *in, int64_t n, const char *dtype) {
  Format f{};
  const int width = Width(dtype, &f);
  if (width == 16) return SpecialBits(static_cast<const uint16_t *>(in), n, f);
  if (width == 32) return SpecialBits(static_cast<const uint32_t *>(in), n, f);
  return -1;
}

}  // namespace

extern "C" int Saturate(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                        void *stream, void *extra) {
  if (nparam != 2) return 1;
  return Saturated(params[0], params[1], Count(ndims[0], shapes[0]), dtypes[0]) < 0 ? 2 : 0;
}

extern "C" int SaturateAsHalf(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                              void *stream, void *extra) {
  if (nparam != 2) return 1;
  return Saturated(params[0], params[1], Count(ndims[0], shapes[0]), dtypes[0], 0x477FE000u) < 0 ? 2 : 0;
}

extern "C" int SaturateAsBfloat(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                                void *stream, void *extra) {
  if (nparam != 2) return 1;
  return Saturated(params[0], params[1], Count(ndims[0], shapes[0]), dtypes[0], 0x7F7F0000u) < 0 ? 2 : 0;
}

extern "C" int Nonfinite(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                         void *stream, void *extra) {
  if (nparam != 3) return 1;
  const int y = Special(params[0], Count(ndims[0], shapes[0]), dtypes[0]);
  const int dout = Special(params[1], Count(ndims[1], shapes[1]), dtypes[1]);
  if (y < 0 || dout < 0) return 2;
  *static_cast<float *>(params[2]) = float(y | dout);
  return 0;
}

extern "C" int SaturateFlag(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                            void *stream, void *extra) {
  if (nparam != 4) return 1;
  const int y = Special(params[0], Count(ndims[0], shapes[0]), dtypes[0]);
  const int dout = Saturated(params[1], params[2], Count(ndims[1], shapes[1]), dtypes[1]);
  if (y < 0 || dout < 0) return 2;
  *static_cast<float *>(params[3]) = float(y | dout);
  return 0;
}
