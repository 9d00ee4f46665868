// The fuzz input as a file, for readers that take a path (llama.cpp's model loader, ggml-ext's side files):
// an in-memory file (memfd) rewritten with each input, named by its /proc/self/fd path.
#pragma once
#define _GNU_SOURCE
#include "ggml.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

// A memfd and its path (path: 64 bytes); aborts when none can be made.
static inline int fuzz_file_open(const char * name, char * path, size_t n) {
    const int fd = memfd_create(name, 0);
    if (fd < 0) {
        perror("memfd_create");
        abort();
    }
    snprintf(path, n, "/proc/self/fd/%d", fd);
    return fd;
}

// The file's bytes become the input's.
static inline void fuzz_file_write(int fd, const uint8_t * data, size_t size) {
    if (ftruncate(fd, 0) != 0 || pwrite(fd, data, size, 0) != (ssize_t) size) {
        abort();
    }
}

// A log callback that drops everything: refusals are expected, and their messages would slow the fuzzer.
static inline void fuzz_quiet(enum ggml_log_level level, const char * text, void * user) {
    (void) level;
    (void) text;
    (void) user;
}
