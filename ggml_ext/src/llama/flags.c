// The values of ggml-ext's flags in llama.cpp's tools (common's arguments: patches 0310, 0320, 0323,
// 0331), parsed here so that a bad value names the flag and what it takes ("--apq-bits: 'abc' is not an
// integer; use 1..8") instead of common's bare "stoi".
#include "ggml-ext-kvquant.h"
#include "ggml-ext-llama.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int ggml_ext_flag_int(const char * flag, const char * value, long lo, long hi, const char * hint, long * out, char * err,
                      size_t n) {
    char * end = NULL;
    errno      = 0;
    const long v = value ? strtol(value, &end, 10) : 0;
    hint         = hint ? hint : "";
    if (value == NULL || value[0] == '\0' || end == value || *end != '\0') {
        snprintf(err, n, "%s: '%s' is not an integer; use %ld..%ld%s", flag, value ? value : "", lo, hi, hint);
        return -1;
    }
    if (errno == ERANGE || v < lo || v > hi) {
        snprintf(err, n, "%s: %s is out of range; use %ld..%ld%s", flag, value, lo, hi, hint);
        return -1;
    }
    *out = v;
    return 0;
}

int ggml_ext_flag_fraction(const char * flag, const char * value, double lo, double below, const char * hint,
                           double * out, char * err, size_t n) {
    char * end = NULL;
    const double v = value ? strtod(value, &end) : 0.0;
    hint           = hint ? hint : "";
    if (value == NULL || value[0] == '\0' || end == value || *end != '\0' || !isfinite(v)) {
        snprintf(err, n, "%s: '%s' is not a number; use %g <= F < %g%s", flag, value ? value : "", lo, below, hint);
        return -1;
    }
    if (!(v >= lo && v < below)) {
        snprintf(err, n, "%s: %s is out of range; use %g <= F < %g%s", flag, value, lo, below, hint);
        return -1;
    }
    *out = v;
    return 0;
}

int ggml_ext_llama_flag_apq_bits(const char * value, char * err, size_t n) {
    long bits = 0;
    if (ggml_ext_flag_int("--apq-bits", value, 1, 8, " (a precision the file serves: `ggml-ext info FILE`)", &bits,
                          err, n) != 0) {
        return -1;
    }
    return ggml_ext_llama_set_apq_bits((int) bits);
}

int ggml_ext_llama_flag_kv_outliers(const char * value, char * err, size_t n) {
    double f = 0.0;
    if (ggml_ext_flag_fraction("--kv-outliers", value, 0.0, 0.5, " (the calibration's outlier fraction, e.g. 0.01)",
                               &f, err, n) != 0) {
        return -1;
    }
    return ggml_ext_llama_set_kv_outliers((float) f);
}

int ggml_ext_llama_flag_kv_sink(const char * value, char * err, size_t n) {
    long sink = 0;
    if (ggml_ext_flag_int("--kv-sink", value, 0, GGML_EXT_KVQUANT_MAX_SINK, " (first positions kept in float)", &sink,
                          err, n) != 0) {
        return -1;
    }
    return ggml_ext_llama_set_kv_sink((int) sink);
}

int ggml_ext_llama_cache_type_error(const char * value, const char * stock, char * err, size_t n) {
    // the names of ggml-ext's cache types, from the type table (nuq4, nuq3, nuq2)
    char ours[128] = "";
    for (int i = 0, m = ggml_ext_type_count(); i < m; i++) {
        const struct ggml_ext_type_info * t = ggml_ext_type_info_at(i);
        if (t->family == GGML_EXT_FAMILY_KVQUANT) {
            const size_t len = strlen(ours);
            snprintf(ours + len, sizeof(ours) - len, "%s%s", len ? ", " : "", t->ggml_name);
        }
    }
    return snprintf(err, n, "'%s' is not a KV cache type; use %s%s%s", value ? value : "", stock ? stock : "",
                    stock && stock[0] ? ", " : "", ours);
}
