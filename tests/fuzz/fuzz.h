/* fuzz.h - the fuzz harnesses of tests/fuzz, as plain functions.
 * defines: act_fuzz_protocol, act_fuzz_weights, act_fuzz_json, act_fuzz_episode, act_fuzz_lzf,
 *          act_fuzz_proxy, FUZZ_ASSERT,
 *          act_fuzz_tmp_file
 *
 * Each act_fuzz_<target>(data, size) feeds one input to the parser it names and returns 0; it
 * never rejects an input by failing. The same functions run under libFuzzer (fuzz_entry.c, a
 * clang build with ACT_FUZZ=ON) and in the always-on ctest test_fuzz_corpus (replay.c, any
 * compiler), which replays the committed corpus: inputs that once crashed stay fixed. A crash,
 * a sanitizer report or a FUZZ_ASSERT (a parser accepted something that breaks its contract)
 * is a finding. */
#ifndef ACT_FUZZ_H
#define ACT_FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int act_fuzz_protocol(const uint8_t *data, size_t size);
int act_fuzz_weights(const uint8_t *data, size_t size);
int act_fuzz_json(const uint8_t *data, size_t size);
int act_fuzz_episode(const uint8_t *data, size_t size);
int act_fuzz_lzf(const uint8_t *data, size_t size);
int act_fuzz_proxy(const uint8_t *data, size_t size);

/* A broken invariant aborts, so libFuzzer saves the input and the replay test fails. */
#define FUZZ_ASSERT(cond, ...)                                                  \
    do {                                                                        \
        if (!(cond)) {                                                          \
            fprintf(stderr, "fuzz invariant broken at %s:%d: ", __FILE__, __LINE__); \
            fprintf(stderr, __VA_ARGS__);                                       \
            fputc('\n', stderr);                                                \
            abort();                                                            \
        }                                                                       \
    } while (0)

/* Writes data to a per-process file in /dev/shm (else /tmp) named by tag, for the parsers that
 * take a path; returns the path (a static buffer per tag slot) or NULL. */
const char *act_fuzz_tmp_file(const char *tag, const uint8_t *data, size_t size);

#endif
