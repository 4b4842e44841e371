/* episode_verdict.h - what a chunk decoder says of one chunk: shared by the gzip inflaters
 * (episode_inflate.h) and the LZF decoder (episode_lzf.h), so that neither's users need the
 * other's header. */
#ifndef ACT_EPISODE_VERDICT_H
#define ACT_EPISODE_VERDICT_H

/* INF_OK: decoded; INF_BAD_DATA: the stream is damaged; INF_TOO_LONG: it decodes to more than
 * the room given; INF_NOMEM: the decoder could not get memory */
enum { INF_OK, INF_BAD_DATA, INF_TOO_LONG, INF_NOMEM };

#endif
