#include "specd/kv_layout.h"

#include <cstring>

namespace specd {

const char* kv_dtype_name(KvDtype dtype) {
  switch (dtype) {
    case KvDtype::kFloat32: return "float32";
    case KvDtype::kFloat16: return "float16";
    case KvDtype::kBFloat16: return "bfloat16";
  }
  return "invalid";
}

Status parse_kv_dtype(const char* name, KvDtype* out) {
  for (KvDtype d : {KvDtype::kFloat32, KvDtype::kFloat16, KvDtype::kBFloat16}) {
    if (name && std::strcmp(name, kv_dtype_name(d)) == 0) {
      *out = d;
      return Status::Ok();
    }
  }
  return error_status(StatusCode::kInvalidArgument, "unknown KV dtype '", name ? name : "(null)",
                      "' (expected float32, float16 or bfloat16)");
}

Status validate_kv_dtype(KvDtype dtype, const char* what) {
  if (dtype == KvDtype::kFloat32 || dtype == KvDtype::kFloat16 || dtype == KvDtype::kBFloat16)
    return Status::Ok();
  return error_status(StatusCode::kInvalidArgument, what, ": invalid dtype ",
                      static_cast<int32_t>(dtype));
}

Status require_cpu_float32(KvDtype dtype, const char* what) {
  if (dtype == KvDtype::kFloat32) return Status::Ok();
  return error_status(StatusCode::kInvalidArgument, what, ": the CPU reference is float32 only, got ",
                      kv_dtype_name(dtype));
}

Status validate_paged_kv_layout(const PagedKvLayout& l, const char* what) {
  if (l.block_size <= 0 || l.kv_heads <= 0 || l.head_dim <= 0)
    return error_status(StatusCode::kInvalidArgument, what,
                        ": block_size, kv_heads and head_dim must be > 0, got ", l.block_size,
                        ", ", l.kv_heads, ", ", l.head_dim);
  if (l.num_pages < 0)
    return error_status(StatusCode::kInvalidArgument, what, ": num_pages must be >= 0, got ",
                        l.num_pages);
  const int64_t page_elems = int64_t{l.block_size} * kv_row_elems(l);
  if (l.page_stride < page_elems)
    return error_status(StatusCode::kInvalidArgument, what, ": page_stride ", l.page_stride,
                        " is smaller than one page (", l.block_size, " x ", l.kv_heads, " x ",
                        l.head_dim, " = ", page_elems, " elements)");
  return Status::Ok();
}

Status validate_block_table(const int32_t* table, int32_t rows, int32_t width, int32_t stride,
                            const char* what) {
  if (rows < 0 || width < 0)
    return error_status(StatusCode::kInvalidArgument, what,
                        ": block table rows and width must be >= 0, got ", rows, " and ", width);
  if (stride < width)
    return error_status(StatusCode::kInvalidArgument, what, ": block table stride ", stride,
                        " is smaller than its width ", width);
  if (rows > 0 && width > 0 && !table)
    return error_status(StatusCode::kInvalidArgument, what, ": null block table");
  return Status::Ok();
}

}  // namespace specd
