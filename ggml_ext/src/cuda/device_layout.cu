// Tensors that ggml-cuda holds in a layout of their own: patch 0400 sends a CUDA buffer's (and backend's)
// set/get of them here, patch 0420 the buffer type's allocation size. Each family keeps the file's bytes as
// what callers write and read back and converts on the way in and out:
//   - a registered type with a stock twin (interleaved4): the base layout, so upstream's kernels run it
//     (interleaved4_cuda.cu);
//   - an any-precision APQ weight: the row-lane layout of anyprec_cuda.h that its GEMV and dequantize
//     kernels read (apq_mul_mat.cu), padded to whole groups of 32 rows and super-chunks of 128 weights.
#include "ggml-ext-cuda.cuh"
#include "ggml-ext.h"

// ggml-cuda's family table (common/families.h): the families whose tensors the GPU holds in a layout of their own.
static const ggml_ext_cuda_family families[GGML_EXT_FAMILY_COUNT] = {
    /* none */ {},
    /* GGML_EXT_FAMILY_INTERLEAVED4 */
    { ggml_ext_cuda_keeps_base_layout, ggml_ext_cuda_set_base_layout, ggml_ext_cuda_get_base_layout, nullptr },
    /* GGML_EXT_FAMILY_CODEBOOKS */ {},
    /* GGML_EXT_FAMILY_ANYPREC */
    { ggml_ext_cuda_anyprec_layout, ggml_ext_cuda_anyprec_set, ggml_ext_cuda_anyprec_get, ggml_ext_cuda_anyprec_alloc_size },
    /* GGML_EXT_FAMILY_KVQUANT */ {},
};
// (C++ has no array designators: the entries stand in enum order, and a family added after these needs no
// entry unless its tensors have a device layout)
static_assert(GGML_EXT_FAMILY_INTERLEAVED4 == 1 && GGML_EXT_FAMILY_CODEBOOKS == 2 && GGML_EXT_FAMILY_ANYPREC == 3 &&
                  GGML_EXT_FAMILY_KVQUANT == 4,
              "the table above lists the families in enum order");

// The entry of t's family when the family holds t in its own layout, else nullptr.
static const ggml_ext_cuda_family * layout_of(const ggml_tensor * t) {
    const int                    family = t != nullptr ? ggml_ext_type_family((int) t->type) : 0;
    const ggml_ext_cuda_family * f      = family != 0 ? &families[family] : nullptr;
    return f != nullptr && f->holds_layout != nullptr && f->holds_layout(t) ? f : nullptr;
}

bool ggml_ext_cuda_device_layout(const ggml_tensor * t) {
    return layout_of(t) != nullptr;
}

void ggml_ext_cuda_set_device_layout(ggml_tensor * t, const void * data, size_t offset, size_t size) {
    const ggml_ext_cuda_family * f = layout_of(t);
    GGML_ASSERT(f != nullptr);
    f->set_layout(t, data, offset, size);
}

void ggml_ext_cuda_get_device_layout(const ggml_tensor * t, void * data, size_t offset, size_t size) {
    const ggml_ext_cuda_family * f = layout_of(t);
    GGML_ASSERT(f != nullptr);
    f->get_layout(t, data, offset, size);
}

void ggml_ext_cuda_set_device_layout_2d(ggml_tensor * t, const void * data, size_t offset, size_t size,
                                        size_t n_copies, size_t stride_tensor, size_t stride_data) {
    for (size_t i = 0; i < n_copies; i++) {
        ggml_ext_cuda_set_device_layout(t, (const char *) data + i * stride_data, offset + i * stride_tensor, size);
    }
}

void ggml_ext_cuda_get_device_layout_2d(const ggml_tensor * t, void * data, size_t offset, size_t size,
                                        size_t n_copies, size_t stride_tensor, size_t stride_data) {
    for (size_t i = 0; i < n_copies; i++) {
        ggml_ext_cuda_get_device_layout(t, (char *) data + i * stride_data, offset + i * stride_tensor, size);
    }
}

size_t ggml_ext_cuda_device_layout_alloc_size(const ggml_tensor * t, size_t size) {
    const ggml_ext_cuda_family * f = layout_of(t);
    if (f == nullptr || f->layout_alloc_size == nullptr) {
        return size;  // the base layout has the registered layout's size
    }
    const size_t own = f->layout_alloc_size(t);
    return own > size ? own : size;
}
