/*
 * The manifest: the commit point of a checkpoint. manifest.pb is a small
 * checksummed wrapper around a protobuf CheckpointManifest; manifest.json is
 * the same content for people. Readers use manifest.pb only, and check every
 * invariant the restore path relies on before anything else looks at it.
 */
#include "persist_internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>
#include <xxhash.h>

void graft__manifest_free(Graft__CheckpointManifest *m)
{
    if (m != NULL)
        graft__checkpoint_manifest__free_unpacked(m, &graft__pb_allocator);
}

static int cmp_piece(const void *a, const void *b)
{
    const uint64_t *x = a, *y = b;
    return x[0] < y[0] ? -1 : x[0] > y[0];
}

/* Every region must be covered exactly once by the shards' pieces, or a
 * restore would leave holes or read one byte from two places. */
static graft_status_t check_coverage(const Graft__CheckpointManifest *m, size_t gi, char *why,
                                     size_t why_len)
{
    const Graft__RegionDesc *g = m->regions[gi]->region;
    size_t n = 0;
    for (size_t s = 0; s < m->n_shards; s++)
        for (size_t r = 0; r < m->shards[s]->n_regions; r++)
            n += strcmp(m->shards[s]->regions[r]->name, g->name) == 0;
    uint64_t(*pieces)[2] = graft__calloc(n ? n : 1, sizeof(*pieces));
    if (pieces == NULL) {
        snprintf(why, why_len, "out of memory");
        return GRAFT_ENOMEM;
    }
    size_t k = 0;
    for (size_t s = 0; s < m->n_shards; s++)
        for (size_t r = 0; r < m->shards[s]->n_regions; r++) {
            const Graft__ShardRegion *sr = m->shards[s]->regions[r];
            if (strcmp(sr->name, g->name) == 0) {
                pieces[k][0] = sr->global_offset;
                pieces[k][1] = sr->bytes;
                k++;
            }
        }
    qsort(pieces, n, sizeof(*pieces), cmp_piece);
    uint64_t cursor = 0;
    graft_status_t st = GRAFT_OK;
    for (size_t i = 0; i < n; i++) {
        if (pieces[i][1] == 0)
            continue;
        if (pieces[i][0] != cursor) {
            st = GRAFT_ECORRUPT;
            break;
        }
        cursor += pieces[i][1];
    }
    if (st == GRAFT_OK && cursor != g->bytes)
        st = GRAFT_ECORRUPT;
    if (st != GRAFT_OK)
        snprintf(why, why_len, "manifest: region %s is not covered exactly by the shards",
                 g->name);
    graft_free(pieces);
    return st;
}

graft_status_t graft__manifest_check(const Graft__CheckpointManifest *m, char *why, size_t why_len)
{
    if (m->version != 1 || m->format_version != GRAFT_PERSIST_FORMAT_VERSION) {
        snprintf(why, why_len, "manifest: unsupported version %u/%u", m->version,
                 m->format_version);
        return GRAFT_EFORMAT;
    }
    if (m->ranks == 0 || m->ranks > GP_MAX_RANKS || m->n_shards != m->ranks) {
        snprintf(why, why_len, "manifest: %zu shards for %u ranks", m->n_shards, m->ranks);
        return GRAFT_ECORRUPT;
    }
    for (size_t i = 0; i < m->n_regions; i++) {
        const Graft__RegionDesc *g = m->regions[i]->region;
        if (g == NULL || g->name == NULL || g->name[0] == '\0' || strlen(g->name) > GP_MAX_NAME) {
            snprintf(why, why_len, "manifest: region %zu has no valid name", i);
            return GRAFT_ECORRUPT;
        }
        for (size_t j = 0; j < i; j++)
            if (strcmp(m->regions[j]->region->name, g->name) == 0) {
                snprintf(why, why_len, "manifest: region %s listed twice", g->name);
                return GRAFT_ECORRUPT;
            }
    }
    uint64_t raw_total = 0;
    for (size_t s = 0; s < m->n_shards; s++) {
        const Graft__ShardInfo *sh = m->shards[s];
        if (sh->rank >= m->ranks) {
            snprintf(why, why_len, "manifest: shard %zu has rank %u of %u", s, sh->rank, m->ranks);
            return GRAFT_ECORRUPT;
        }
        for (size_t t = 0; t < s; t++)
            if (m->shards[t]->rank == sh->rank) {
                snprintf(why, why_len, "manifest: rank %u listed twice", sh->rank);
                return GRAFT_ECORRUPT;
            }
        /* The file name is fixed by the format, so a manifest can never
         * point a reader outside the checkpoint directory. */
        char expect[64];
        snprintf(expect, sizeof(expect), "shard-%u-of-%u", sh->rank, m->ranks);
        if (sh->file == NULL || strcmp(sh->file, expect) != 0) {
            snprintf(why, why_len, "manifest: rank %u names file '%.64s', expected %s", sh->rank,
                     sh->file ? sh->file : "", expect);
            return GRAFT_ECORRUPT;
        }
        if (sh->raw_bytes > UINT64_MAX - raw_total) {
            snprintf(why, why_len, "manifest: sizes overflow");
            return GRAFT_ECORRUPT;
        }
        raw_total += sh->raw_bytes;
        for (size_t r = 0; r < sh->n_regions; r++) {
            const Graft__ShardRegion *sr = sh->regions[r];
            size_t gi = 0;
            while (gi < m->n_regions && strcmp(m->regions[gi]->region->name, sr->name) != 0)
                gi++;
            if (gi == m->n_regions) {
                snprintf(why, why_len, "%s: region %.64s not in the global layout", expect,
                         sr->name);
                return GRAFT_ECORRUPT;
            }
            uint64_t gsize = m->regions[gi]->region->bytes;
            if (sr->global_offset > gsize || sr->bytes > gsize - sr->global_offset ||
                sr->offset_in_shard > sh->raw_bytes ||
                sr->bytes > sh->raw_bytes - sr->offset_in_shard) {
                snprintf(why, why_len, "%s: region %s range out of bounds", expect, sr->name);
                return GRAFT_ECORRUPT;
            }
        }
    }
    if (raw_total != m->raw_bytes) {
        snprintf(why, why_len, "manifest: shard sizes do not add up");
        return GRAFT_ECORRUPT;
    }
    for (size_t i = 0; i < m->n_regions; i++) {
        graft_status_t st = check_coverage(m, i, why, why_len);
        if (st != GRAFT_OK)
            return st;
    }
    if (graft__persist_global_hash(m) != m->layout_hash) {
        snprintf(why, why_len, "manifest: layout hash mismatch");
        return GRAFT_ECORRUPT;
    }
    return GRAFT_OK;
}

static void put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t get64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

/* The MAC (docs/FORMAT.md): HMAC-SHA256 under the key of GP_MAC_LABEL
 * followed by the payload bytes that precede the mac field, which the
 * writer appends last as GP_MAC_FIELD_BYTES bytes: the field's tag (17,
 * length-delimited: 0x8a 0x01), its length (0x20) and the 32 bytes. */
#define GP_MAC_LABEL "graft checkpoint manifest mac v1"
#define GP_MAC_TAG "\x8a\x01\x20"
#define GP_MAC_FIELD_BYTES (3u + GRAFT_MAC_BYTES)

static graft_status_t manifest_mac(const graft__persist_key_t *key, const uint8_t *payload,
                                   size_t len, uint8_t out[GRAFT_MAC_BYTES])
{
    size_t label = sizeof(GP_MAC_LABEL) - 1;
    uint8_t *msg = graft__malloc(label + len + 1);
    if (msg == NULL)
        return GRAFT_ENOMEM;
    memcpy(msg, GP_MAC_LABEL, label);
    memcpy(msg + label, payload, len);
    graft_status_t st = graft__hmac_sha256(key->bytes, key->len, msg, label + len, out);
    graft_free(msg);
    return st;
}

static graft_status_t mac_check(const graft__persist_key_t *key, const uint8_t *payload,
                                size_t len, const Graft__CheckpointManifest *m, char *why,
                                size_t why_len)
{
    uint8_t want[GRAFT_MAC_BYTES];
    if (m->mac.len == 0) {
        snprintf(why, why_len, GP_MANIFEST_PB ": no MAC: written without the job secret, or "
                               "forged");
        return GRAFT_ECORRUPT;
    }
    /* The decoded field must be the one the MAC leaves out: the last
     * bytes of the payload, once. */
    if (m->mac.len != GRAFT_MAC_BYTES || len < GP_MAC_FIELD_BYTES ||
        memcmp(payload + len - GP_MAC_FIELD_BYTES, GP_MAC_TAG, 3) != 0 ||
        memcmp(payload + len - GRAFT_MAC_BYTES, m->mac.data, GRAFT_MAC_BYTES) != 0) {
        snprintf(why, why_len, GP_MANIFEST_PB ": MAC malformed or not at the end: forged");
        return GRAFT_ECORRUPT;
    }
    graft_status_t st = manifest_mac(key, payload, len - GP_MAC_FIELD_BYTES, want);
    if (st != GRAFT_OK) {
        snprintf(why, why_len, GP_MANIFEST_PB ": MAC not computed: %s", graft_status_string(st));
        return st;
    }
    if (!graft__mac_equal(m->mac.data, m->mac.len, want)) {
        snprintf(why, why_len, GP_MANIFEST_PB ": MAC does not match the job secret: forged, or "
                               "written under another secret");
        return GRAFT_ECORRUPT;
    }
    return GRAFT_OK;
}

graft_status_t graft__manifest_read(const char *dir, uint64_t step, Graft__CheckpointManifest **m_p,
                                    char *why, size_t why_len)
{
    return graft__manifest_read_keyed(dir, step, NULL, m_p, why, why_len);
}

graft_status_t graft__manifest_read_keyed(const char *dir, uint64_t step,
                                          const graft__persist_key_t *key,
                                          Graft__CheckpointManifest **m_p, char *why,
                                          size_t why_len)
{
    graft_status_t st;
    int fd = -1;
    uint8_t *buf = NULL;
    Graft__CheckpointManifest *m = NULL;
    char *path = graft__asprintf("%s/" GP_MANIFEST_PB, dir);
    if (path == NULL) {
        snprintf(why, why_len, "out of memory");
        return GRAFT_ENOMEM;
    }
    /* Never read through a link: what the manifest names is checked
     * against files in this directory only. */
    fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) {
        snprintf(why, why_len, GP_MANIFEST_PB ": %s",
                 errno == ELOOP ? "a symbolic link, not read" : strerror(errno));
        st = errno == ENOENT ? GRAFT_ENOTFOUND : GRAFT_EIO;
        goto out;
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        snprintf(why, why_len, GP_MANIFEST_PB ": fstat: %s", strerror(errno));
        st = GRAFT_EIO;
        goto out;
    }
    uint64_t size = (uint64_t)sb.st_size;
    if (size < GP_MANIFEST_HEADER_BYTES || size > GP_MAX_MANIFEST_BYTES) {
        snprintf(why, why_len, GP_MANIFEST_PB ": size %llu out of range", (unsigned long long)size);
        st = size < GP_MANIFEST_HEADER_BYTES ? GRAFT_ETRUNCATED : GRAFT_ECORRUPT;
        goto out;
    }
    buf = graft__malloc((size_t)size);
    if (buf == NULL) {
        snprintf(why, why_len, "out of memory");
        st = GRAFT_ENOMEM;
        goto out;
    }
    size_t got = 0;
    while (got < size) {
        ssize_t n = read(fd, buf + got, (size_t)size - got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        got += (size_t)n;
    }
    if (got != size) {
        snprintf(why, why_len, GP_MANIFEST_PB ": short read");
        st = GRAFT_EIO;
        goto out;
    }
    if (memcmp(buf, GP_MANIFEST_MAGIC, 8) != 0 || get64(buf + 32) != XXH3_64bits(buf, 32)) {
        snprintf(why, why_len, GP_MANIFEST_PB ": bad magic or header checksum");
        st = GRAFT_ECORRUPT;
        goto out;
    }
    if (get64(buf + 8) != GRAFT_PERSIST_FORMAT_VERSION) {
        snprintf(why, why_len, GP_MANIFEST_PB ": unsupported version %llu",
                 (unsigned long long)get64(buf + 8));
        st = GRAFT_EFORMAT;
        goto out;
    }
    uint64_t plen = get64(buf + 16);
    if (plen != size - GP_MANIFEST_HEADER_BYTES) {
        snprintf(why, why_len, GP_MANIFEST_PB ": payload length %llu but file holds %llu",
                 (unsigned long long)plen, (unsigned long long)(size - GP_MANIFEST_HEADER_BYTES));
        st = plen > size - GP_MANIFEST_HEADER_BYTES ? GRAFT_ETRUNCATED : GRAFT_ECORRUPT;
        goto out;
    }
    if (XXH3_64bits(buf + GP_MANIFEST_HEADER_BYTES, (size_t)plen) != get64(buf + 24)) {
        snprintf(why, why_len, GP_MANIFEST_PB ": payload checksum mismatch");
        st = GRAFT_EHASH;
        goto out;
    }
    m = graft__checkpoint_manifest__unpack(&graft__pb_allocator, (size_t)plen,
                                           buf + GP_MANIFEST_HEADER_BYTES);
    if (m == NULL) {
        /* protobuf-c returns NULL for bytes that do not decode and for a
         * failed allocation alike; a manifest that decodes without the
         * hooks was lost to memory, and must not be called corrupt (a
         * reader would pass over a good checkpoint). */
        ProtobufCMessage *probe = protobuf_c_message_unpack(
            &graft__checkpoint_manifest__descriptor, NULL, (size_t)plen,
            buf + GP_MANIFEST_HEADER_BYTES);
        st = probe != NULL ? GRAFT_ENOMEM : GRAFT_ECORRUPT;
        protobuf_c_message_free_unpacked(probe, NULL);
        snprintf(why, why_len, GP_MANIFEST_PB ": %s",
                 st == GRAFT_ENOMEM ? "out of memory" : "protobuf does not decode");
        goto out;
    }
    st = graft__manifest_check(m, why, why_len);
    if (st != GRAFT_OK)
        goto out;
    if (m->step != step) {
        snprintf(why, why_len, GP_MANIFEST_PB ": step %llu in directory of step %llu",
                 (unsigned long long)m->step, (unsigned long long)step);
        st = GRAFT_ECORRUPT;
        goto out;
    }
    if (key != NULL) {
        st = mac_check(key, buf + GP_MANIFEST_HEADER_BYTES, (size_t)plen, m, why, why_len);
        if (st != GRAFT_OK)
            goto out;
    }
    *m_p = m;
    m = NULL;
out:
    graft__manifest_free(m);
    graft_free(buf);
    if (fd >= 0)
        close(fd);
    graft_free(path);
    return st;
}

static const char *kind_name(int kind)
{
    static const char *const names[] = {"unspecified", "param", "optim", "rng", "sched",
                                        "data",        "scaler", "step", "blob"};
    return kind >= 0 && kind < (int)GRAFT_ARRAY_SIZE(names) ? names[kind] : "unknown";
}

static json_t *hex64(uint64_t v)
{
    char b[20];
    snprintf(b, sizeof(b), "%016llx", (unsigned long long)v);
    return json_string(b);
}

static json_t *hex_bytes(const uint8_t *p, size_t n)
{
    char b[2 * GRAFT_MAC_BYTES + 1];
    n = GRAFT_MIN(n, (size_t)GRAFT_MAC_BYTES);
    for (size_t i = 0; i < n; i++)
        snprintf(b + 2 * i, 3, "%02x", p[i]);
    b[2 * n] = '\0';
    return json_string(b);
}

static json_t *manifest_json(const Graft__CheckpointManifest *m)
{
    json_t *root = json_object();
    json_t *regions = json_array();
    json_t *shards = json_array();
    if (root == NULL || regions == NULL || shards == NULL)
        goto fail;
    for (size_t i = 0; i < m->n_regions; i++) {
        const Graft__RegionDesc *g = m->regions[i]->region;
        if (json_array_append_new(regions,
                                  json_pack("{s:s,s:s,s:i,s:s,s:I}", "name", g->name, "kind",
                                            kind_name(g->kind), "dtype", (json_int_t)g->dtype,
                                            "device", g->device ? "cuda" : "host", "bytes",
                                            (json_int_t)g->bytes)) != 0)
            goto fail;
    }
    for (size_t s = 0; s < m->n_shards; s++) {
        const Graft__ShardInfo *sh = m->shards[s];
        json_t *pieces = json_array();
        if (pieces == NULL)
            goto fail;
        for (size_t r = 0; r < sh->n_regions; r++) {
            const Graft__ShardRegion *sr = sh->regions[r];
            if (json_array_append_new(pieces, json_pack("{s:s,s:I,s:I,s:I}", "name", sr->name,
                                                        "global_offset",
                                                        (json_int_t)sr->global_offset, "bytes",
                                                        (json_int_t)sr->bytes, "offset_in_shard",
                                                        (json_int_t)sr->offset_in_shard)) != 0) {
                json_decref(pieces);
                goto fail;
            }
        }
        if (json_array_append_new(
                shards, json_pack("{s:i,s:i,s:s,s:I,s:o,s:o,s:I,s:I,s:I,s:I,s:o}", "rank",
                                  (json_int_t)sh->rank, "written_by_group",
                                  (json_int_t)sh->written_by_group, "file", sh->file, "file_bytes",
                                  (json_int_t)sh->file_bytes, "footer_hash", hex64(sh->file_hash),
                                  "layout_hash", hex64(sh->layout_hash), "raw_bytes",
                                  (json_int_t)sh->raw_bytes, "stored_bytes",
                                  (json_int_t)sh->stored_bytes, "chunks",
                                  (json_int_t)sh->chunk_count, "chunk_bytes",
                                  (json_int_t)sh->chunk_bytes, "regions", pieces)) != 0)
            goto fail;
    }
    double ratio = m->stored_bytes ? (double)m->raw_bytes / (double)m->stored_bytes : 1.0;
    if (json_object_set_new(root, "format_version", json_integer(m->format_version)) != 0 ||
        json_object_set_new(root, "step", json_integer((json_int_t)m->step)) != 0 ||
        json_object_set_new(root, "unix_ms", json_integer((json_int_t)m->unix_ms)) != 0 ||
        json_object_set_new(root, "library_version", json_string(m->library_version)) != 0 ||
        json_object_set_new(root, "code_revision", json_string(m->code_revision)) != 0 ||
        json_object_set_new(root, "ranks", json_integer(m->ranks)) != 0 ||
        json_object_set_new(root, "layout_hash", hex64(m->layout_hash)) != 0 ||
        json_object_set_new(root, "raw_bytes", json_integer((json_int_t)m->raw_bytes)) != 0 ||
        json_object_set_new(root, "stored_bytes", json_integer((json_int_t)m->stored_bytes)) != 0 ||
        json_object_set_new(root, "compression_level", json_integer(m->compression_level)) != 0 ||
        json_object_set_new(root, "compression_ratio", json_real(ratio)) != 0 ||
        json_object_set_new(root, "fingerprint",
                            m->has_fingerprint ? hex64(m->fingerprint) : json_null()) != 0 ||
        json_object_set_new(root, "before_config_change",
                            json_boolean(m->before_config_change)) != 0 ||
        (m->mac.len > 0 && json_object_set_new(root, "mac", hex_bytes(m->mac.data,
                                                                     m->mac.len)) != 0) ||
        json_object_set_new(root, "regions", regions) != 0) {
        regions = NULL;
        goto fail;
    }
    regions = NULL;
    if (json_object_set_new(root, "shards", shards) != 0) {
        shards = NULL;
        goto fail;
    }
    return root;
fail:
    json_decref(regions);
    json_decref(shards);
    json_decref(root);
    return NULL;
}

graft_status_t graft__manifest_write(const graft__pdir_t *d, const Graft__CheckpointManifest *m,
                                     const graft__persist_key_t *key, uint32_t mode)
{
    graft_status_t st;
    uint8_t *buf = NULL;
    char *text = NULL;
    json_t *j = NULL;
    uint8_t mac[GRAFT_MAC_BYTES];
    Graft__CheckpointManifest mm = *m;
    mm.mac.data = NULL;
    mm.mac.len = 0;
    size_t plen = graft__checkpoint_manifest__get_packed_size(&mm);
    size_t mac_bytes = key != NULL ? GP_MAC_FIELD_BYTES : 0;
    buf = graft__malloc(GP_MANIFEST_HEADER_BYTES + plen + mac_bytes);
    if (buf == NULL)
        return GRAFT_ENOMEM;
    graft__checkpoint_manifest__pack(&mm, buf + GP_MANIFEST_HEADER_BYTES);
    if (key != NULL) {
        st = manifest_mac(key, buf + GP_MANIFEST_HEADER_BYTES, plen, mac);
        if (st != GRAFT_OK)
            goto out;
        memcpy(buf + GP_MANIFEST_HEADER_BYTES + plen, GP_MAC_TAG, 3);
        memcpy(buf + GP_MANIFEST_HEADER_BYTES + plen + 3, mac, GRAFT_MAC_BYTES);
        plen += mac_bytes;
        mm.mac.data = mac;
        mm.mac.len = GRAFT_MAC_BYTES;
    }
    j = manifest_json(&mm);
    text = j != NULL ? json_dumps(j, JSON_INDENT(2) | JSON_SORT_KEYS) : NULL;
    if (text == NULL) {
        GRAFT_ERROR(GRAFT_MOD_PERSIST, "building %s/" GP_MANIFEST_JSON ": out of memory", d->path);
        st = GRAFT_ENOMEM;
        goto out;
    }
    memcpy(buf, GP_MANIFEST_MAGIC, 8);
    put64(buf + 8, GRAFT_PERSIST_FORMAT_VERSION);
    put64(buf + 16, plen);
    put64(buf + 24, XXH3_64bits(buf + GP_MANIFEST_HEADER_BYTES, plen));
    put64(buf + 32, XXH3_64bits(buf, 32));
    st = graft__persist_file_atomic(d, GP_MANIFEST_JSON, text, strlen(text), mode);
    if (st != GRAFT_OK)
        goto out;
    st = graft__persist_file_atomic(d, GP_MANIFEST_PB, buf, GP_MANIFEST_HEADER_BYTES + plen, mode);
out:
    free(text); /* jansson's allocator */
    json_decref(j);
    graft_free(buf);
    explicit_bzero(mac, sizeof(mac));
    return st;
}

graft_status_t graft__checkpoint_verify(const char *dir, const Graft__CheckpointManifest *m,
                                        bool full, char *why, size_t why_len)
{
    graft_status_t st = GRAFT_OK;
    for (size_t s = 0; s < m->n_shards && st == GRAFT_OK; s++) {
        const Graft__ShardInfo *sh = m->shards[s];
        graft__shard_t *f = NULL;
        char *path = graft__asprintf("%s/%s", dir, sh->file);
        if (path == NULL) {
            snprintf(why, why_len, "out of memory");
            return GRAFT_ENOMEM;
        }
        st = graft__shard_open(path, &f, why, why_len);
        graft_free(path);
        if (st == GRAFT_ENOTFOUND)
            st = GRAFT_ETRUNCATED; /* the manifest promised it */
        if (st != GRAFT_OK)
            break;
        if (f->file_bytes != sh->file_bytes || f->footer.footer_hash != sh->file_hash ||
            f->header.step != m->step || f->header.rank != sh->rank ||
            f->header.ranks != m->ranks || f->header.raw_bytes != sh->raw_bytes ||
            f->header.layout_hash != sh->layout_hash) {
            snprintf(why, why_len, "%s: does not match the manifest (size, footer or header)",
                     sh->file);
            st = GRAFT_ECORRUPT;
        }
        for (uint64_t c = 0; full && st == GRAFT_OK && c < f->footer.chunk_count; c++) {
            const uint8_t *raw;
            st = graft__shard_chunk(f, c, &raw, why, why_len);
        }
        graft__shard_close(f);
    }
    return st;
}

/* --------------------------------------------------------- second tier --- */

static graft_status_t copy_file(const char *from, const graft__pdir_t *to, const char *name,
                                uint32_t mode)
{
    graft__tmpfile_t f = {.fd = -1};
    char *src = graft__asprintf("%s/%s", from, name);
    uint8_t *buf = graft__malloc(1 << 20);
    int in = -1;
    graft_status_t st = src != NULL && buf != NULL ? graft__tmpfile_open(&f, to, name, mode)
                                                   : GRAFT_ENOMEM;
    if (st != GRAFT_OK)
        goto done;
    in = open(src, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (in < 0) {
        GRAFT_ERROR(GRAFT_MOD_PERSIST, "copy %s -> %s: %s", src, f.tmp, strerror(errno));
        st = GRAFT_EIO;
        goto done;
    }
    for (;;) {
        ssize_t n = read(in, buf, 1 << 20);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            GRAFT_ERROR(GRAFT_MOD_PERSIST, "read %s: %s", src, strerror(errno));
            st = GRAFT_EIO;
            break;
        }
        if (n == 0)
            break;
        st = graft__persist_write_all(f.fd, buf, (size_t)n, f.tmp);
        if (st != GRAFT_OK)
            break;
    }
    if (st == GRAFT_OK)
        st = graft__tmpfile_sync(&f);
    if (st == GRAFT_OK)
        st = graft__tmpfile_install(&f);
done:
    if (in >= 0)
        close(in);
    graft__tmpfile_close(&f);
    graft_free(buf);
    graft_free(src);
    return st;
}

graft_status_t graft__persist_copy_checkpoint(const char *from_root, const char *to_root,
                                              uint64_t step, const graft__persist_key_t *key,
                                              uint32_t mode)
{
    graft_status_t st;
    char why[256] = "";
    Graft__CheckpointManifest *m = NULL, *m2 = NULL;
    graft__pdir_t to = {.fd = -1};
    char *from = graft__persist_step_dir(from_root, step);
    if (from == NULL) {
        st = GRAFT_ENOMEM;
        goto out;
    }
    st = graft__manifest_read_keyed(from, step, key, &m, why, sizeof(why));
    if (st != GRAFT_OK) {
        GRAFT_ERROR(GRAFT_MOD_PERSIST, "second tier: %s: %s", from, why);
        goto out;
    }
    st = graft__persist_dir_open(to_root, step, true, mode, &to);
    for (size_t s = 0; s < m->n_shards && st == GRAFT_OK; s++)
        st = copy_file(from, &to, m->shards[s]->file, mode);
    if (st == GRAFT_OK)
        st = copy_file(from, &to, GP_MANIFEST_JSON, mode);
    if (st == GRAFT_OK && fsync(to.fd) != 0) {
        GRAFT_ERROR(GRAFT_MOD_PERSIST, "fsync %s: %s", to.path, strerror(errno));
        st = GRAFT_EIO;
    }
    if (st == GRAFT_OK)
        st = copy_file(from, &to, GP_MANIFEST_PB, mode);
    if (st != GRAFT_OK)
        goto out;
    /* Verify what landed there, not what we meant to write. */
    st = graft__manifest_read_keyed(to.path, step, key, &m2, why, sizeof(why));
    if (st == GRAFT_OK)
        st = graft__checkpoint_verify(to.path, m2, true, why, sizeof(why));
    if (st != GRAFT_OK)
        GRAFT_ERROR(GRAFT_MOD_PERSIST, "second tier: %s does not verify: %s", to.path, why);
out:
    graft__persist_dir_close(&to);
    graft__manifest_free(m);
    graft__manifest_free(m2);
    graft_free(from);
    return st;
}

graft_status_t graft_persist_manifest_json(const char *root, uint64_t step, char **json_p)
{
    graft_status_t st;
    char why[256] = "";
    char *dir = NULL;
    char *text = NULL;
    char *copy = NULL;
    json_t *j = NULL;
    Graft__CheckpointManifest *m = NULL;
    if (root == NULL || json_p == NULL)
        return GRAFT_EINVAL;
    dir = graft__persist_step_dir(root, step);
    if (dir == NULL) {
        st = GRAFT_ENOMEM;
        goto out;
    }
    st = graft__manifest_read(dir, step, &m, why, sizeof(why));
    if (st != GRAFT_OK) {
        GRAFT_DEBUG(GRAFT_MOD_PERSIST, "%s: %s", dir, why);
        goto out;
    }
    /* The same rendering, keys sorted and indented, as the writer's sidecar. */
    j = manifest_json(m);
    text = j != NULL ? json_dumps(j, JSON_INDENT(2) | JSON_SORT_KEYS) : NULL;
    copy = text != NULL ? graft__malloc(strlen(text) + 1) : NULL;
    if (copy == NULL) {
        st = GRAFT_ENOMEM;
        goto out;
    }
    memcpy(copy, text, strlen(text) + 1);
    *json_p = copy;
out:
    free(text); /* jansson's allocator */
    json_decref(j);
    graft__manifest_free(m);
    graft_free(dir);
    return st;
}
