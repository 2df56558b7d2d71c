/*
 * The watch stream: bytes as curl may deliver them, cut into pieces at
 * places the input chooses, through the line splitter and the decoder of
 * each line. The first input byte picks the pieces' length (1..64) and a
 * small line limit half of the time, so the limit is reached too. Decoded
 * events are checked to be in revision order, as the watch relies on.
 */
#include "fuzz_common.h"
#include "etcd_internal.h"

#include <assert.h>

static graft_status_t on_line(void *arg, const char *line, size_t len)
{
    size_t *lines = arg;
    graft_etcd_watch_msg_t m;
    assert(len > 0 && memchr(line, '\n', len) == NULL);
    (*lines)++;
    graft_status_t st = graft__etcd_watch_msg_decode(line, len, &m);
    if (st != GRAFT_OK)
        return st;
    if (m.kind == GRAFT_ETCD_WATCH_MSG_EVENTS) {
        assert(m.n_events == 0 || m.events != NULL);
        for (size_t i = 0; i < m.n_events; i++) {
            assert(m.events[i].kv.mod_revision > 0);
            assert(i == 0 || m.events[i].kv.mod_revision >= m.events[i - 1].kv.mod_revision);
        }
    } else {
        assert(m.n_events == 0);
    }
    if (m.kind == GRAFT_ETCD_WATCH_MSG_ERROR)
        assert(m.error != GRAFT_OK);
    graft__etcd_watch_msg_clear(&m);
    return GRAFT_OK;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    graft_buf_t line;
    size_t lines = 0;
    if (size < 1)
        return 0;
    size_t piece = 1 + (data[0] & 63);
    size_t max_line = (data[0] & 64) ? 128 : GRAFT_ETCD_MAX_WATCH_LINE;
    graft__buf_init(&line);
    for (size_t off = 1; off < size; off += piece) {
        size_t n = size - off < piece ? size - off : piece;
        if (graft__etcd_watch_split(&line, (const char *)data + off, n, max_line, on_line,
                                    &lines) != GRAFT_OK)
            break;
        assert(line.len <= max_line);
        assert(line.len == 0 || memchr(line.data, '\n', line.len) == NULL);
    }
    graft__buf_free(&line);
    return 0;
}
