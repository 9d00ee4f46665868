// The KVQuant cache types NUQ4 / NUQ3 / NUQ2 in ggml-cpu (docs/KVQUANT.md "In llama.cpp's cache"): which
// ops the CPU backend runs on them. As values: appending (set_rows, cpy from F32/F16 through the
// CPU traits' from_float, patch 0110), reading rows back (get_rows, cpy to F32 through to_float) and flash
// attention with a NUQ V (ggml's one_chunk path dequantizes each V row with to_float). A NUQ K needs the
// pre-RoPE key path (docs/KVQUANT.md) and is refused; no matmul.
#include "common/simd.h"
#include "formats/kvquant/kvquant_decode.h"
#include "ggml-backend.h"
#include "ggml-cpu-impl.h"
#include "common/families.h"
#include "ggml-ext-kvquant.h"

// The types' to_float (ggml-base) decodes blocks with this build's SIMD decoder from the moment
// ggml-cpu is loaded (formats/kvquant/kvquant_decode.h); GGML_EXT_KVQ_DECODE=ref keeps the scalar reference.
static void register_decoder(void) {
#if defined(GGML_EXT_HAVE_AVX2)
    ggml_ext_kvquant_set_block_decoder(ggml_ext_kvquant_block_decode_avx2, "avx2");
#elif defined(GGML_EXT_HAVE_NEON)
    ggml_ext_kvquant_set_block_decoder(ggml_ext_kvquant_block_decode_neon, "neon");
#else
    ggml_ext_kvquant_set_block_decoder(NULL, NULL);
#endif
}

#if defined(__GNUC__)
__attribute__((constructor)) static void register_decoder_at_load(void) {
    register_decoder();
}
#endif

static bool is_ours(const struct ggml_tensor * t) {
    const struct ggml_ext_type_info * i = t ? ggml_ext_type_info_by_id((int) t->type) : NULL;
    return i && i->family == GGML_EXT_FAMILY_KVQUANT;
}

// NUQ bytes the CPU may read or write: in host memory. A cache in a device buffer (CUDA: ggml_ext/src/cuda/
// kvquant_cuda.cu) is bound to its tables by its device address; a copy the scheduler would make for the CPU lies
// outside every binding and would read with uniform levels, so the CPU refuses such nodes (the device runs them,
// or the scheduler stops with a message) rather than compute garbage.
static bool on_host(const struct ggml_tensor * t) {
    const struct ggml_backend_buffer * b = t->view_src ? t->view_src->buffer : t->buffer;
    return !b || ggml_backend_buffer_is_host((ggml_backend_buffer_t) b);
}

static bool nuq_on_host(const struct ggml_tensor * op) {
    if (is_ours(op) && !on_host(op)) {
        return false;
    }
    for (int i = 0; i < GGML_MAX_SRC; i++) {
        if (is_ours(op->src[i]) && !on_host(op->src[i])) {
            return false;
        }
    }
    return true;
}

static bool plain(const struct ggml_tensor * t) {
    return t && (t->type == GGML_TYPE_F32 || t->type == GGML_TYPE_F16);
}

bool ggml_ext_kvquant_cpu_supports_op(const struct ggml_tensor * op) {
#if !defined(__GNUC__)
    static volatile int registered;  // no load-time constructor: before the first graph instead
    if (!registered) {
        register_decoder();
        registered = 1;
    }
#endif
    if (!nuq_on_host(op)) {
        return false;
    }
    switch (op->op) {
        case GGML_OP_SET_ROWS:
            return is_ours(op) && plain(op->src[0]);
        case GGML_OP_CPY:
        case GGML_OP_DUP:
            return (is_ours(op) && op->src[0]->type == GGML_TYPE_F32) ||
                   (is_ours(op->src[0]) && op->type == GGML_TYPE_F32);
        case GGML_OP_GET_ROWS:
            return is_ours(op->src[0]) && op->type == GGML_TYPE_F32;
        case GGML_OP_FLASH_ATTN_EXT:
            return !is_ours(op->src[0]) && !is_ours(op->src[1]) && is_ours(op->src[2]);
        case GGML_OP_CUSTOM:
            return ggml_ext_kvquant_attn_is_node(op);  // the decode attention's partial sums (backend/kvquant_attn_cpu.c)
        default:
            return false;
    }
}

bool ggml_ext_kvquant_cpu_mul_mat(const struct ggml_compute_params * params, struct ggml_tensor * dst) {
    (void) params, (void) dst;
    return false;
}
