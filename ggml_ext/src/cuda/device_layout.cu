// Tensors that ggml-cuda holds in a layout of their own: patch 0400 sends a CUDA buffer's (and backend's)
// set/get of them here, patch 0420 the buffer type's allocation size. Each family keeps the file's bytes as
// what callers write and read back and converts on the way in and out:
//   - a registered type with a stock twin (interleaved4): the base layout, so upstream's kernels run it
//     (interleaved4_cuda.cu);
//   - an any-precision APQ weight: the row-lane layout of anyprec_cuda.h that its GEMV and dequantize
//     kernels read (apq_mul_mat.cu), padded to whole groups of 32 rows and super-chunks of 128 weights.
#include "ggml-ext-cuda.cuh"

bool ggml_ext_cuda_device_layout(const ggml_tensor * t) {
    return ggml_ext_cuda_keeps_base_layout(t) || ggml_ext_cuda_anyprec_layout(t);
}

void ggml_ext_cuda_set_device_layout(ggml_tensor * t, const void * data, size_t offset, size_t size) {
    if (ggml_ext_cuda_anyprec_layout(t)) {
        ggml_ext_cuda_anyprec_set(t, data, offset, size);
    } else {
        ggml_ext_cuda_set_base_layout(t, data, offset, size);
    }
}

void ggml_ext_cuda_get_device_layout(const ggml_tensor * t, void * data, size_t offset, size_t size) {
    if (ggml_ext_cuda_anyprec_layout(t)) {
        ggml_ext_cuda_anyprec_get(t, data, offset, size);
    } else {
        ggml_ext_cuda_get_base_layout(t, data, offset, size);
    }
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
    if (ggml_ext_cuda_anyprec_layout(t)) {
        const size_t own = ggml_ext_cuda_anyprec_alloc_size(t);
        return own > size ? own : size;
    }
    return size;  // the base layout has the registered layout's size
}
