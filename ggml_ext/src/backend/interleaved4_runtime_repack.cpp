// Runtime repack of plain Q4_0 weights into our interleaved layout (see the header): the
// repack buffer's traits for the weights we take. set_tensor copies a weight in through
// repack() (our lossless ggml_ext_repack_q4_0), and the CPU backend's extra-buffer hook
// sends their MUL_MAT to compute_forward (our mul_mat, the one the Q4_0_8_8 type runs).
#include "backend/interleaved4_runtime_repack.h"
#include "common/settings.h"

#include "formats/interleaved4/interleaved4_impl.h"
#include "ggml-impl.h"
#include "repack.h"

#include <cstdlib>
#include <cstring>

namespace {

class q4_0_traits : public ggml::cpu::repack::tensor_traits_base {
  public:
    explicit q4_0_traits(ggml_ext_interleaved4_layout layout) : layout(layout) {}

    // Q8_0 activations, one row per src1 row: the size ggml plans for types 31-33.
    bool work_size(int /* n_threads */, const struct ggml_tensor * op, size_t & size) override {
        if (op->op != GGML_OP_MUL_MAT) {
            return false;
        }
        size = ggml_row_size(GGML_TYPE_Q8_0, ggml_nelements(op->src[1]));
        return true;
    }

    bool compute_forward(struct ggml_compute_params * params, struct ggml_tensor * op) override {
        if (op->op != GGML_OP_MUL_MAT) {
            return false;
        }
        ggml_ext_cpu_mul_mat_q4_0_layout(params, op, layout);
        return true;
    }

    int repack(struct ggml_tensor * t, const void * data, size_t data_size) override {
        GGML_ASSERT(data_size == ggml_nbytes(t));
        GGML_LOG_DEBUG("%s: ggml-ext runtime repack of %s into %s\n", __func__, t->name,
                       ggml_ext_interleaved4_layout_traits(GGML_EXT_INTERLEAVED4_Q4_0, layout)->name);
        return ggml_ext_repack_q4_0(layout, t->data, (const ggml_ext_block_q4_0 *) data, t->ne[1], t->ne[0]);
    }

  private:
    const ggml_ext_interleaved4_layout layout;
};

// GGML_EXT_RUNTIME_REPACK=0 (or off/false/no) leaves every weight to upstream's repack.
bool enabled() {
    return ggml_ext_settings_runtime_repack();
}

}  // namespace

const ggml::cpu::tensor_traits * ggml_ext_cpu_repack_traits(const struct ggml_tensor * cur) {
#if defined(GGML_EXT_HAVE_AVX2)
    // x86: our 8x8 AVX2 / AVX-512 VNNI kernels beat upstream's q4_0_8x8 (docs/RESULTS.md).
    // Arm keeps upstream's choice: its 4x4 / 4x8 GEMMs are hand-written asm that our
    // intrinsics only match in instruction count, and no Arm timing says ours are faster.
    static const q4_0_traits q4_0_8_8(GGML_EXT_INTERLEAVED4_8X8);
    if (enabled() && cur->type == GGML_TYPE_Q4_0 && cur->ne[2] == 1 && cur->ne[3] == 1 && cur->ne[1] % 8 == 0 &&
        cur->ne[0] % GGML_EXT_QK4_0 == 0) {
        return &q4_0_8_8;
    }
#else
    (void) cur;
#endif
    return nullptr;
}
