// CUDA GEMV of the any-precision bitplanes (docs/formats/anyprec.md): y = W_b x reading only the first b
// planes of the file's layout and precision b's fp16 tables. Not an op yet (the op and the type are the
// next step): ggml_ext_apq_gemv_cuda is a plain launcher, compiled into ggml-cuda with GGML_EXT_CUDA=ON and
// by scripts/device_anyprec.sh standalone, which checks it against the CPU reference and times it.
//
// Loads: thread t of a warp reads 32-bit word c = t, t+32, ... of a row's plane (consecutive words across
// the warp: each plane row is read in coalesced 128-byte runs). The activations are staged in shared
// memory transposed, xs[j * n_chunks + c] = x[32 c + j], so the 32 threads reading weight j of their
// chunks hit 32 consecutive words (no bank conflicts) without permuting the file's bytes (the paper
// permutes the bytes of the planes instead; that variant is the next step). Each warp handles rows in
// turn; its row's table sits in shared memory as float.
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#define APQ_WARPS 8
#define APQ_ROWS_PER_BLOCK 32

template <int BITS>
static __global__ void apq_gemv_kernel(const uint32_t * __restrict__ planes, const __half * __restrict__ tables,
                                       int64_t n_rows, int64_t n_per_row, int seed_bits,
                                       const float * __restrict__ x, float * __restrict__ y) {
    extern __shared__ float smem[];
    const int64_t n_chunks = n_per_row / 32;
    float *       xs       = smem;                            // n_per_row floats, transposed
    float *       luts     = smem + n_per_row;                // APQ_WARPS x 2^BITS floats
    for (int64_t i = threadIdx.x; i < n_per_row; i += blockDim.x) {
        xs[(i % 32) * n_chunks + i / 32] = x[i];
    }
    __syncthreads();
    const int     warp         = threadIdx.x / 32;
    const int     lane         = threadIdx.x % 32;
    float *       lut          = luts + warp * (1 << BITS);
    const int64_t plane_words  = n_rows * n_chunks;           // 32-bit words per plane
    const int64_t tab0         = n_rows * ((1 << BITS) - (1 << seed_bits));
    const int64_t row_begin    = (int64_t) blockIdx.x * APQ_ROWS_PER_BLOCK;
    for (int64_t r = row_begin + warp; r < row_begin + APQ_ROWS_PER_BLOCK && r < n_rows; r += APQ_WARPS) {
        const __half * t = tables + tab0 + r * (1 << BITS);
        for (int c = lane; c < (1 << BITS); c += 32) {
            lut[c] = __half2float(t[c]);
        }
        __syncwarp();
        float acc = 0.0f;
        for (int64_t c = lane; c < n_chunks; c += 32) {
            uint32_t w[BITS];
#pragma unroll
            for (int k = 0; k < BITS; k++) {
                w[k] = __ldg(planes + k * plane_words + r * n_chunks + c);
            }
#pragma unroll
            for (int j = 0; j < 32; j++) {
                int code = 0;
#pragma unroll
                for (int k = 0; k < BITS; k++) {
                    code |= ((w[k] >> j) & 1) << (BITS - 1 - k);
                }
                acc += lut[code] * xs[j * n_chunks + c];
            }
        }
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) {
            acc += __shfl_xor_sync(0xffffffffu, acc, off);
        }
        if (lane == 0) {
            y[r] = acc;
        }
        __syncwarp();
    }
}

template <int BITS>
static cudaError_t apq_launch(const uint8_t * planes, const uint16_t * tables, int64_t n_rows, int64_t n_per_row,
                              int seed_bits, const float * x, float * y, cudaStream_t stream) {
    const size_t smem = sizeof(float) * ((size_t) n_per_row + (size_t) APQ_WARPS * (1u << BITS));
    cudaError_t  e    = cudaFuncSetAttribute(apq_gemv_kernel<BITS>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             (int) smem);
    if (e != cudaSuccess) {
        return e;
    }
    const unsigned blocks = (unsigned) ((n_rows + APQ_ROWS_PER_BLOCK - 1) / APQ_ROWS_PER_BLOCK);
    apq_gemv_kernel<BITS><<<blocks, 32 * APQ_WARPS, smem, stream>>>(
        (const uint32_t *) planes, (const __half *) tables, n_rows, n_per_row, seed_bits, x, y);
    return cudaGetLastError();
}

// planes, tables, x, y in device memory (the file's bytes as they are); n_per_row a multiple of 32 and at
// most about 50000 (x is staged in shared memory); 1 <= seed_bits <= bits <= 8. Returns cudaErrorInvalidValue
// for bad arguments.
extern "C" cudaError_t ggml_ext_apq_gemv_cuda(const uint8_t * planes, const uint16_t * tables, int64_t n_rows,
                                              int64_t n_per_row, int seed_bits, int bits, const float * x, float * y,
                                              cudaStream_t stream) {
    if (n_per_row <= 0 || n_per_row % 32 || seed_bits < 1 || bits < seed_bits || bits > 8 || n_rows < 0) {
        return cudaErrorInvalidValue;
    }
    if (n_rows == 0) {
        return cudaSuccess;
    }
    switch (bits) {
        case 1: return apq_launch<1>(planes, tables, n_rows, n_per_row, seed_bits, x, y, stream);
        case 2: return apq_launch<2>(planes, tables, n_rows, n_per_row, seed_bits, x, y, stream);
        case 3: return apq_launch<3>(planes, tables, n_rows, n_per_row, seed_bits, x, y, stream);
        case 4: return apq_launch<4>(planes, tables, n_rows, n_per_row, seed_bits, x, y, stream);
        case 5: return apq_launch<5>(planes, tables, n_rows, n_per_row, seed_bits, x, y, stream);
        case 6: return apq_launch<6>(planes, tables, n_rows, n_per_row, seed_bits, x, y, stream);
        case 7: return apq_launch<7>(planes, tables, n_rows, n_per_row, seed_bits, x, y, stream);
        default: return apq_launch<8>(planes, tables, n_rows, n_per_row, seed_bits, x, y, stream);
    }
}
