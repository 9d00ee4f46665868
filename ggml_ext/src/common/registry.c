// The type registry: ggml-ext-types.def as a table, for the hooks (ggml-base and ggml-cpu),
// the kernel dispatch and Python (ggml_ext.formats, through ctypes). Compiled into ggml-base.
#include "ggml-ext.h"

#include <stddef.h>

// The shape rule names what a tensor of the type must satisfy beyond whole blocks per row.
// (GROUPED with one row per group: the anyprec family's APQ, whose planes span the whole matrix)
#define GGML_EXT_SHAPE_RULE_GROUPED(BASE, ROWS)                                                          \
    ((ROWS) > 1 ? "interleaved " #BASE " type needs a row count (ne[1]) divisible by " #ROWS             \
                : "a whole matrix's bitplanes, read only by its op: any row count")
#define GGML_EXT_SHAPE_RULE_ROWWISE(BASE, ROWS) "rows stand alone: any row count"
#define GGML_EXT_IS_ROWWISE_GROUPED false
#define GGML_EXT_IS_ROWWISE_ROWWISE true
#define GGML_EXT_TYPE(NAME, ID, BLCK, TYPE_SIZE, ROWS, CHUNK, GGML_NAME, FAMILY, LAYOUT, BASE, BASE_ID, VEC_DOT, \
                      VEC_DOT_ID, ROWWISE)                                                                        \
    { #NAME,  GGML_NAME, ID,      BLCK,  TYPE_SIZE, ROWS, CHUNK, GGML_EXT_FAMILY_##FAMILY, GGML_EXT_FAMILY_NAME_##FAMILY, \
      LAYOUT, BASE_ID,   #BASE,   VEC_DOT_ID, GGML_EXT_SHAPE_RULE_##ROWWISE(BASE, ROWS), GGML_EXT_IS_ROWWISE_##ROWWISE },
static const struct ggml_ext_type_info types[] = {
#include "ggml-ext-types.def"
};

#define N_TYPES ((int) (sizeof(types) / sizeof(types[0])))

int ggml_ext_type_count(void) {
    return N_TYPES;
}

const struct ggml_ext_type_info * ggml_ext_type_info_at(int i) {
    return i >= 0 && i < N_TYPES ? &types[i] : NULL;
}

const struct ggml_ext_type_info * ggml_ext_type_info_by_id(int id) {
    for (int i = 0; i < N_TYPES; i++) {
        if (types[i].id == id) {
            return &types[i];
        }
    }
    return NULL;
}

bool ggml_ext_is_type(int type) {
    return ggml_ext_type_info_by_id(type) != NULL;
}

int ggml_ext_type_family(int type) {
    const struct ggml_ext_type_info * t = ggml_ext_type_info_by_id(type);
    return t ? t->family : 0;
}

int ggml_ext_type_first_own(void) {
    return GGML_EXT_TYPE_FIRST_OWN;
}

int ggml_ext_type_last_own(void) {
    return GGML_EXT_TYPE_LAST_OWN;
}
