/* Force-included into every mlx-c translation unit and into bindgen (Weft's own code).
 * Bridges gaps between mlx-c 0.7.0's headers and non-Apple toolchains. */
#ifndef WEFT_MLX_SHIM_H
#define WEFT_MLX_SHIM_H

/* 1. mlx-c's half.h declares float16_t / bfloat16_t (and the *_float16 / *_bfloat16 accessors)
 *    only on aarch64, but mlx-rs uses them on every target. All uses are through pointers or
 *    by-value 2-byte copies, so any 2-byte type with MLX's bit layout works. */
#if !defined(__aarch64__) && (!defined(__cplusplus) || __has_include(<mlx/types/half_types.h>))
#define HAS_FLOAT16
#define HAS_BFLOAT16
#ifdef __cplusplus
/* (guarded by __has_include: cmake's compiler probes see this header without MLX's paths) */
#include <mlx/types/half_types.h>
typedef mlx::core::float16_t float16_t;
typedef mlx::core::bfloat16_t bfloat16_t;
#else
#include <stdint.h>
/* clang accepts __fp16 on every target as a storage-only type (bindgen sees this side). */
typedef __fp16 float16_t;
typedef uint16_t bfloat16_t;
#endif
#endif

/* 2. mlx-c's private/io.h uses std::format, which GCC 12's libstdc++ lacks. A minimal
 *    "{}"-substituting stand-in, used only when the standard one is missing. */
#if defined(__cplusplus) && !__has_include(<format>)
#include <sstream>
#include <string>
#include <string_view>
namespace std {
namespace weft_shim_detail {
inline void format_rest(std::ostringstream& out, std::string_view fmt) { out << fmt; }
template <class T, class... Rest>
void format_rest(std::ostringstream& out, std::string_view fmt, const T& first, const Rest&... rest) {
  auto at = fmt.find("{}");
  if (at == std::string_view::npos) { out << fmt; return; }
  out << fmt.substr(0, at) << first;
  format_rest(out, fmt.substr(at + 2), rest...);
}
}  // namespace weft_shim_detail
template <class... Args>
std::string format(std::string_view fmt, const Args&... args) {
  std::ostringstream out;
  weft_shim_detail::format_rest(out, fmt, args...);
  return out.str();
}
}  // namespace std
#endif

#endif /* WEFT_MLX_SHIM_H */
