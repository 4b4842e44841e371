/* episode_lzf.h - h5py's LZF filter (HDF5 filter id 32000), decompression only.
 * defines: ACT_EP_FILTER_LZF, act_ep_lzf_decode, act_ep_lzf_register
 *
 * h5py's `compression="lzf"` is a filter of h5py's own: libhdf5 does not have it, and neither has
 * h5repack, so an episode a Python recorder saved with it could not be read here nor re-saved with
 * HDF5's tools. Its stored chunks are bare LZF streams (Marc Lehmann's liblzf format); a chunk
 * that would not shrink is stored raw with the filter's bit set in its mask (h5py makes the filter
 * optional). The open's check (episode_check.c) decodes every chunk HDF5's path will read, the
 * pool (episode_inflate.c) decodes the chunks it reads on its threads, and HDF5's own path gets
 * this decoder as its filter 32000 (act_ep_lzf_register). */
#ifndef ACT_EPISODE_LZF_H
#define ACT_EPISODE_LZF_H

#include <stddef.h>
#include <stdint.h>

#include "episode_verdict.h"

#define ACT_EP_FILTER_LZF 32000

/* Decodes the LZF stream in[in_len] into out[cap]; *got the decoded length. An INF_* verdict
 * (episode_verdict.h): INF_TOO_LONG when the output needs more than cap, INF_BAD_DATA for a
 * stream that ends inside an instruction or refers back before the output's start. */
int act_ep_lzf_decode(const uint8_t *in, size_t in_len, uint8_t *out, size_t cap, size_t *got);

/* Registers the decoder as HDF5's filter 32000, once per process (in place of any other; called
 * when an episode's dataset uses that filter). Writing with it fails: the engine only reads. */
void act_ep_lzf_register(void);
#ifdef ACT_WITH_HDF5
#include <hdf5.h>
/* act_ep_lzf_register when dataset ds is stored with filter 32000 */
void act_ep_lzf_register_for(hid_t ds);
#endif

#endif
