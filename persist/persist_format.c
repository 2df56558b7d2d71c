/*
 * The shard file format (docs/FORMAT.md): encoders for the writer and a
 * decoder that trusts nothing it reads. Every size and offset of a shard is
 * checked against the file's real size and against the header before it is
 * used, so a hostile or damaged file can cause an error, never an
 * out-of-bounds read or an allocation larger than one chunk.
 */
#include "persist_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t on the stack */
#include <xxhash.h>
#include <zstd.h>

static void put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t get32(const uint8_t *p)
{
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

static uint64_t get64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

void graft__persist_header_encode(const graft__shard_header_t *h, uint8_t out[GP_HEADER_BYTES])
{
    memset(out, 0, GP_HEADER_BYTES);
    memcpy(out, GP_SHARD_MAGIC, 8);
    put32(out + 8, h->version);
    put32(out + 12, GP_HEADER_BYTES);
    put64(out + 16, h->step);
    put32(out + 24, h->rank);
    put32(out + 28, h->ranks);
    put64(out + 32, h->layout_hash);
    put64(out + 40, h->raw_bytes);
    put64(out + 48, h->chunk_bytes);
    put64(out + 56, XXH3_64bits(out, 56));
}

void graft__persist_entry_encode(const graft__chunk_entry_t *e, uint8_t out[GP_INDEX_ENTRY_BYTES])
{
    put64(out, e->offset);
    put64(out + 8, e->stored_bytes);
    put64(out + 16, e->raw_bytes);
    put64(out + 24, e->stored_hash);
    put64(out + 32, e->raw_hash);
    put32(out + 40, e->codec);
    put32(out + 44, 0);
}

void graft__persist_footer_encode(graft__shard_footer_t *f, uint8_t out[GP_FOOTER_BYTES])
{
    put64(out, f->index_offset);
    put64(out + 8, f->chunk_count);
    put64(out + 16, f->index_hash);
    put64(out + 24, f->raw_bytes);
    f->footer_hash = XXH3_64bits(out, 32);
    put64(out + 32, f->footer_hash);
    memcpy(out + 40, GP_FOOTER_MAGIC, 8);
}

static graft_status_t pread_exact(int fd, void *buf, size_t len, uint64_t off, const char *file,
                                  char *why, size_t why_len)
{
    size_t done = 0;
    while (done < len) {
        ssize_t n = pread(fd, (char *)buf + done, len - done, (off_t)(off + done));
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            snprintf(why, why_len, "%s: read at %llu: %s", file, (unsigned long long)(off + done),
                     strerror(errno));
            return GRAFT_EIO;
        }
        if (n == 0) {
            snprintf(why, why_len, "%s: unexpected end of file at %llu", file,
                     (unsigned long long)(off + done));
            return GRAFT_ETRUNCATED;
        }
        done += (size_t)n;
    }
    return GRAFT_OK;
}

static graft_status_t header_decode(const uint8_t *b, const char *file, graft__shard_header_t *h,
                                    char *why, size_t why_len)
{
    if (memcmp(b, GP_SHARD_MAGIC, 8) != 0) {
        snprintf(why, why_len, "%s: bad magic in header", file);
        return GRAFT_ECORRUPT;
    }
    if (get64(b + 56) != XXH3_64bits(b, 56)) {
        snprintf(why, why_len, "%s: header checksum mismatch", file);
        return GRAFT_ECORRUPT;
    }
    h->version = get32(b + 8);
    if (h->version != GRAFT_PERSIST_FORMAT_VERSION || get32(b + 12) != GP_HEADER_BYTES) {
        snprintf(why, why_len, "%s: unsupported format version %u", file, h->version);
        return GRAFT_EFORMAT;
    }
    h->step = get64(b + 16);
    h->rank = get32(b + 24);
    h->ranks = get32(b + 28);
    h->layout_hash = get64(b + 32);
    h->raw_bytes = get64(b + 40);
    h->chunk_bytes = get64(b + 48);
    if (h->ranks == 0 || h->ranks > GP_MAX_RANKS || h->rank >= h->ranks ||
        h->chunk_bytes < GP_MIN_CHUNK_BYTES || h->chunk_bytes > GP_MAX_CHUNK_BYTES) {
        snprintf(why, why_len, "%s: header out of range (rank %u of %u, chunk %llu)", file, h->rank,
                 h->ranks, (unsigned long long)h->chunk_bytes);
        return GRAFT_ECORRUPT;
    }
    return GRAFT_OK;
}

/* The footer, the index and every entry are checked against each other and
 * against the file size, so nothing later needs to re-check bounds. */
static graft_status_t index_check(graft__shard_t *s, const uint8_t *idx, char *why, size_t why_len)
{
    uint64_t n = s->footer.chunk_count;
    uint64_t cursor = GP_HEADER_BYTES;
    for (uint64_t i = 0; i < n; i++) {
        const uint8_t *p = idx + i * GP_INDEX_ENTRY_BYTES;
        graft__chunk_entry_t *e = &s->chunks[i];
        e->offset = get64(p);
        e->stored_bytes = get64(p + 8);
        e->raw_bytes = get64(p + 16);
        e->stored_hash = get64(p + 24);
        e->raw_hash = get64(p + 32);
        e->codec = get32(p + 40);
        uint64_t want_raw = GRAFT_MIN(s->header.chunk_bytes,
                                      s->header.raw_bytes - i * s->header.chunk_bytes);
        bool ok = e->offset == cursor && e->raw_bytes == want_raw && get32(p + 44) == 0;
        if (ok && e->codec == GP_CODEC_STORED)
            ok = e->stored_bytes == e->raw_bytes;
        else if (ok && e->codec == GP_CODEC_ZSTD)
            ok = e->stored_bytes > 0 && e->stored_bytes <= ZSTD_compressBound(e->raw_bytes);
        else
            ok = false;
        if (ok)
            ok = e->stored_bytes <= s->footer.index_offset - cursor;
        if (!ok) {
            snprintf(why, why_len, "%s: chunk %llu: index entry out of range", s->file,
                     (unsigned long long)i);
            return GRAFT_ECORRUPT;
        }
        cursor += e->stored_bytes;
    }
    if (cursor != s->footer.index_offset) {
        snprintf(why, why_len, "%s: index does not reach the index offset", s->file);
        return GRAFT_ECORRUPT;
    }
    return GRAFT_OK;
}

static graft_status_t shard_load(graft__shard_t *s, char *why, size_t why_len)
{
    uint8_t hb[GP_HEADER_BYTES];
    uint8_t fb[GP_FOOTER_BYTES];
    uint8_t *idx = NULL;
    graft_status_t st;
    struct stat sb;

    if (fstat(s->fd, &sb) != 0) {
        snprintf(why, why_len, "%s: fstat: %s", s->file, strerror(errno));
        st = GRAFT_EIO;
        goto out;
    }
    s->file_bytes = (uint64_t)sb.st_size;
    if (s->file_bytes < GP_HEADER_BYTES + GP_FOOTER_BYTES) {
        snprintf(why, why_len, "%s: truncated (%llu bytes)", s->file,
                 (unsigned long long)s->file_bytes);
        st = GRAFT_ETRUNCATED;
        goto out;
    }
    st = pread_exact(s->fd, hb, sizeof(hb), 0, s->file, why, why_len);
    if (st != GRAFT_OK)
        goto out;
    st = header_decode(hb, s->file, &s->header, why, why_len);
    if (st != GRAFT_OK)
        goto out;
    st = pread_exact(s->fd, fb, sizeof(fb), s->file_bytes - GP_FOOTER_BYTES, s->file, why,
                     why_len);
    if (st != GRAFT_OK)
        goto out;
    if (memcmp(fb + 40, GP_FOOTER_MAGIC, 8) != 0) {
        snprintf(why, why_len, "%s: no footer (truncated or overwritten)", s->file);
        st = GRAFT_ETRUNCATED;
        goto out;
    }
    s->footer.index_offset = get64(fb);
    s->footer.chunk_count = get64(fb + 8);
    s->footer.index_hash = get64(fb + 16);
    s->footer.raw_bytes = get64(fb + 24);
    s->footer.footer_hash = get64(fb + 32);
    if (s->footer.footer_hash != XXH3_64bits(fb, 32)) {
        snprintf(why, why_len, "%s: footer checksum mismatch", s->file);
        st = GRAFT_ECORRUPT;
        goto out;
    }
    uint64_t cb = s->header.chunk_bytes;
    uint64_t want_chunks = s->header.raw_bytes / cb + (s->header.raw_bytes % cb != 0);
    uint64_t index_room = s->file_bytes - GP_FOOTER_BYTES;
    if (s->footer.raw_bytes != s->header.raw_bytes || s->footer.chunk_count != want_chunks ||
        s->footer.index_offset < GP_HEADER_BYTES || s->footer.index_offset > index_room ||
        (index_room - s->footer.index_offset) / GP_INDEX_ENTRY_BYTES != want_chunks ||
        (index_room - s->footer.index_offset) % GP_INDEX_ENTRY_BYTES != 0) {
        snprintf(why, why_len, "%s: footer disagrees with header or file size", s->file);
        st = GRAFT_ECORRUPT;
        goto out;
    }
    /* Bounded by the file size checked just above. */
    size_t idx_len = (size_t)(want_chunks * GP_INDEX_ENTRY_BYTES);
    idx = graft__malloc(idx_len);
    s->chunks = graft__calloc(want_chunks ? want_chunks : 1, sizeof(*s->chunks));
    if (idx == NULL || s->chunks == NULL) {
        snprintf(why, why_len, "%s: out of memory for the index", s->file);
        st = GRAFT_ENOMEM;
        goto out;
    }
    st = pread_exact(s->fd, idx, idx_len, s->footer.index_offset, s->file, why, why_len);
    if (st != GRAFT_OK)
        goto out;
    if (XXH3_64bits(idx, idx_len) != s->footer.index_hash) {
        snprintf(why, why_len, "%s: index checksum mismatch", s->file);
        st = GRAFT_ECORRUPT;
        goto out;
    }
    st = index_check(s, idx, why, why_len);
out:
    graft_free(idx);
    return st;
}

graft_status_t graft__shard_open(const char *path, graft__shard_t **shard_p, char *why,
                                 size_t why_len)
{
    graft_status_t st;
    graft__shard_t *s = graft__calloc(1, sizeof(*s));
    if (s == NULL) {
        snprintf(why, why_len, "out of memory");
        return GRAFT_ENOMEM;
    }
    s->fd = -1;
    s->cached = UINT64_MAX;
    s->path = graft__strdup(path);
    if (s->path == NULL) {
        snprintf(why, why_len, "out of memory");
        st = GRAFT_ENOMEM;
        goto err_free;
    }
    const char *slash = strrchr(s->path, '/');
    s->file = slash ? slash + 1 : s->path;
    s->fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (s->fd < 0) {
        int e = errno;
        snprintf(why, why_len, "%s: %s (%s)", s->file, e == ELOOP ? "a symbolic link" : "missing",
                 e == ELOOP ? "not read" : strerror(e));
        st = e == ENOENT ? GRAFT_ENOTFOUND : e == ELOOP ? GRAFT_ECORRUPT : GRAFT_EIO;
        goto err_free;
    }
    st = shard_load(s, why, why_len);
    if (st != GRAFT_OK)
        goto err_free;
    /* Restores read chunks in order: ask for aggressive readahead. */
    (void)posix_fadvise(s->fd, 0, 0, POSIX_FADV_SEQUENTIAL);
    *shard_p = s;
    return GRAFT_OK;

err_free:
    graft__shard_close(s);
    return st;
}

void graft__shard_close(graft__shard_t *s)
{
    if (s == NULL)
        return;
    if (s->fd >= 0)
        close(s->fd);
    if (s->dctx != NULL)
        ZSTD_freeDCtx(s->dctx);
    graft_free(s->chunks);
    graft_free(s->raw);
    graft_free(s->stored);
    graft_free(s->path);
    graft_free(s);
}

static graft_status_t ensure(uint8_t **buf, uint64_t *cap, uint64_t need)
{
    if (*cap >= need)
        return GRAFT_OK;
    graft_free(*buf);
    *cap = 0;
    *buf = graft__malloc((size_t)need);
    if (*buf == NULL)
        return GRAFT_ENOMEM;
    *cap = need;
    return GRAFT_OK;
}

graft_status_t graft__shard_chunk(graft__shard_t *s, uint64_t i, const uint8_t **raw_p, char *why,
                                  size_t why_len)
{
    graft_status_t st;
    if (i >= s->footer.chunk_count) {
        snprintf(why, why_len, "%s: chunk %llu does not exist", s->file, (unsigned long long)i);
        return GRAFT_EINVAL;
    }
    if (s->cached == i) {
        *raw_p = s->raw;
        return GRAFT_OK;
    }
    s->cached = UINT64_MAX;
    const graft__chunk_entry_t *e = &s->chunks[i];
    /* raw_bytes <= chunk_bytes <= 256 MiB and stored_bytes <= its zstd
     * bound were checked when the index was read. */
    if (ensure(&s->raw, &s->raw_cap, e->raw_bytes ? e->raw_bytes : 1) != GRAFT_OK) {
        snprintf(why, why_len, "%s: chunk %llu: out of memory", s->file, (unsigned long long)i);
        return GRAFT_ENOMEM;
    }
    uint8_t *in = s->raw;
    if (e->codec == GP_CODEC_ZSTD) {
        if (ensure(&s->stored, &s->stored_cap, e->stored_bytes) != GRAFT_OK) {
            snprintf(why, why_len, "%s: chunk %llu: out of memory", s->file,
                     (unsigned long long)i);
            return GRAFT_ENOMEM;
        }
        in = s->stored;
    }
    char sub[192];
    st = pread_exact(s->fd, in, (size_t)e->stored_bytes, e->offset, s->file, sub, sizeof(sub));
    if (st != GRAFT_OK) {
        snprintf(why, why_len, "chunk %llu: %s", (unsigned long long)i, sub);
        return st;
    }
    if (XXH3_64bits(in, (size_t)e->stored_bytes) != e->stored_hash) {
        snprintf(why, why_len, "%s: chunk %llu: stored hash mismatch", s->file,
                 (unsigned long long)i);
        return GRAFT_EHASH;
    }
    if (e->codec == GP_CODEC_ZSTD) {
        if (s->dctx == NULL)
            s->dctx = ZSTD_createDCtx();
        if (s->dctx == NULL) {
            snprintf(why, why_len, "%s: out of memory for a decoder", s->file);
            return GRAFT_ENOMEM;
        }
        unsigned long long fcs = ZSTD_getFrameContentSize(in, (size_t)e->stored_bytes);
        size_t n = 0;
        if (fcs == e->raw_bytes)
            n = ZSTD_decompressDCtx(s->dctx, s->raw, (size_t)e->raw_bytes, in,
                                    (size_t)e->stored_bytes);
        if (fcs != e->raw_bytes || ZSTD_isError(n) || n != e->raw_bytes) {
            snprintf(why, why_len, "%s: chunk %llu: zstd frame does not decode to %llu bytes",
                     s->file, (unsigned long long)i, (unsigned long long)e->raw_bytes);
            return GRAFT_ECORRUPT;
        }
    }
    if (XXH3_64bits(s->raw, (size_t)e->raw_bytes) != e->raw_hash) {
        snprintf(why, why_len, "%s: chunk %llu: raw hash mismatch", s->file,
                 (unsigned long long)i);
        return GRAFT_EHASH;
    }
    s->cached = i;
    *raw_p = s->raw;
    return GRAFT_OK;
}

graft_status_t graft__shard_read(graft__shard_t *s, uint64_t off, void *dst, uint64_t len,
                                 char *why, size_t why_len)
{
    if (off > s->header.raw_bytes || len > s->header.raw_bytes - off) {
        snprintf(why, why_len, "%s: range %llu+%llu beyond %llu raw bytes", s->file,
                 (unsigned long long)off, (unsigned long long)len,
                 (unsigned long long)s->header.raw_bytes);
        return GRAFT_ECORRUPT;
    }
    uint64_t cb = s->header.chunk_bytes;
    while (len > 0) {
        uint64_t i = off / cb;
        uint64_t in_chunk = off - i * cb;
        const uint8_t *raw;
        graft_status_t st = graft__shard_chunk(s, i, &raw, why, why_len);
        if (st != GRAFT_OK)
            return st;
        uint64_t n = GRAFT_MIN(len, s->chunks[i].raw_bytes - in_chunk);
        memcpy(dst, raw + in_chunk, (size_t)n);
        dst = (uint8_t *)dst + n;
        off += n;
        len -= n;
    }
    return GRAFT_OK;
}

/* ---------------------------------------------------------------- paths --- */

char *graft__persist_step_dir(const char *root, uint64_t step)
{
    return graft__asprintf("%s/step-%020llu", root, (unsigned long long)step);
}

char *graft__persist_shard_name(uint32_t rank, uint32_t ranks)
{
    return graft__asprintf("shard-%u-of-%u", rank, ranks);
}

bool graft__persist_parse_step_dir(const char *name, uint64_t *step_p)
{
    if (strncmp(name, "step-", 5) != 0 || strlen(name) != 25)
        return false;
    uint64_t v = 0;
    for (const char *p = name + 5; *p; p++) {
        if (*p < '0' || *p > '9')
            return false;
        uint64_t d = (uint64_t)(*p - '0');
        if (v > (UINT64_MAX - d) / 10)
            return false;
        v = v * 10 + d;
    }
    *step_p = v;
    return true;
}

/* ---------------------------------------------------------- layout hash --- */

static void hash_u64(XXH3_state_t *h, uint64_t v)
{
    uint8_t b[8];
    put64(b, v);
    XXH3_64bits_update(h, b, 8);
}

static void hash_str(XXH3_state_t *h, const char *s)
{
    size_t n = s ? strlen(s) : 0;
    hash_u64(h, n);
    if (n)
        XXH3_64bits_update(h, s, n);
}

uint64_t graft__persist_layout_hash(const graft_persist_region_t *regions, size_t n)
{
    XXH3_state_t h;
    XXH3_64bits_reset(&h);
    hash_u64(&h, n);
    for (size_t i = 0; i < n; i++) {
        const graft_persist_region_t *r = &regions[i];
        hash_str(&h, r->name);
        hash_u64(&h, (uint64_t)r->kind);
        hash_u64(&h, r->dtype);
        hash_u64(&h, r->bytes);
        hash_u64(&h, r->global_bytes ? r->global_offset : 0);
        hash_u64(&h, r->global_bytes ? r->global_bytes : r->bytes);
    }
    return XXH3_64bits_digest(&h);
}

uint64_t graft__persist_global_hash(const Graft__CheckpointManifest *m)
{
    XXH3_state_t h;
    XXH3_64bits_reset(&h);
    hash_u64(&h, m->n_regions);
    for (size_t i = 0; i < m->n_regions; i++) {
        const Graft__RegionDesc *r = m->regions[i]->region;
        hash_str(&h, r->name);
        hash_u64(&h, (uint64_t)r->kind);
        hash_u64(&h, r->dtype);
        hash_u64(&h, r->bytes);
    }
    return XXH3_64bits_digest(&h);
}
