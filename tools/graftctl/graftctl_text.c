/*
 * Text that graftctl did not write itself (event details, member
 * addresses, checkpoint reasons, a manifest's names and code revision, an
 * HTTP request's Host), made safe to print.
 *
 * Anyone who can write the job's etcd records or a checkpoint root chooses
 * those bytes; printed raw, an escape sequence in them drives the
 * operator's terminal (colours, a changed window title, a cleared screen
 * that hides the lines before it, and on some terminals worse). So every
 * human output passes such text through graftctl_text(), which keeps
 * printable UTF-8 as it is and writes everything else visibly:
 *
 *   \n \r \t             newline, carriage return, tab
 *   \xNN                  any other C0 control byte, DEL, and each byte of
 *                         a sequence that is not valid UTF-8 (a lone
 *                         continuation byte, a truncated or overlong
 *                         sequence, a surrogate, beyond U+10FFFF)
 *   \u{NN}, \u{NNNN}      C1 controls (U+0080..U+009F: U+009B is CSI),
 *                         bidirectional overrides and isolates
 *                         (U+202A..U+202E, U+2066..U+2069) and the line
 *                         and paragraph separators (U+2028, U+2029)
 *
 * A backslash stays as it is: the escaped form is printable ASCII, so
 * escaping it again (text that went through graftctl_json_text() and is
 * then printed) changes nothing.
 *
 * JSON output needs none of this (jansson escapes control characters),
 * except that jansson refuses a string that is not valid UTF-8:
 * graftctl_json_text() gives such a string in its escaped form instead.
 */
#include "graftctl.h"

#include <stdio.h>
#include <string.h>

/* The length of the valid UTF-8 sequence at s (1..4) and its code point,
 * or 0 when the bytes there are not one. */
static size_t utf8_decode(const unsigned char *s, uint32_t *cp_p)
{
    uint32_t cp;
    size_t n;
    if (s[0] < 0x80) {
        *cp_p = s[0];
        return 1;
    }
    if (s[0] >= 0xc2 && s[0] <= 0xdf) {
        cp = s[0] & 0x1fu;
        n = 2;
    } else if (s[0] >= 0xe0 && s[0] <= 0xef) {
        cp = s[0] & 0x0fu;
        n = 3;
    } else if (s[0] >= 0xf0 && s[0] <= 0xf4) {
        cp = s[0] & 0x07u;
        n = 4;
    } else {
        return 0; /* a continuation byte, an overlong lead (C0, C1), F5..FF */
    }
    for (size_t i = 1; i < n; i++) {
        if ((s[i] & 0xc0) != 0x80)
            return 0; /* includes the terminating NUL */
        cp = (cp << 6) | (s[i] & 0x3fu);
    }
    if ((n == 3 && cp < 0x800) || (n == 4 && (cp < 0x10000 || cp > 0x10ffff)) ||
        (cp >= 0xd800 && cp <= 0xdfff))
        return 0;
    *cp_p = cp;
    return n;
}

/* Code points a terminal acts on rather than shows. */
static bool cp_needs_escape(uint32_t cp)
{
    return cp < 0x20 || cp == 0x7f || (cp >= 0x80 && cp <= 0x9f) || cp == 0x2028 ||
           cp == 0x2029 || (cp >= 0x202a && cp <= 0x202e) || (cp >= 0x2066 && cp <= 0x2069);
}

/* Appends piece (n bytes) to buf if it fits whole, keeping room for the
 * truncation mark; returns false when it did not fit. */
static bool put(char *buf, size_t len, size_t *used, const char *piece, size_t n)
{
    if (*used + n + 4 > len) /* "..." and the NUL */
        return false;
    memcpy(buf + *used, piece, n);
    *used += n;
    buf[*used] = '\0';
    return true;
}

const char *graftctl_text(const char *s, char *buf, size_t len)
{
    size_t used = 0;
    if (len < 4) /* no room for anything but the mark: callers pass real buffers */
        return "";
    buf[0] = '\0';
    if (s == NULL)
        return buf;
    const unsigned char *p = (const unsigned char *)s;
    while (*p != '\0') {
        uint32_t cp = 0;
        size_t n = utf8_decode(p, &cp);
        char esc[16];
        const char *piece = (const char *)p;
        size_t plen = n;
        if (n == 0) {
            snprintf(esc, sizeof(esc), "\\x%02x", p[0]);
            piece = esc;
            plen = 4;
            n = 1;
        } else if (cp_needs_escape(cp)) {
            if (cp == '\n' || cp == '\r' || cp == '\t')
                snprintf(esc, sizeof(esc), "\\%c", cp == '\n' ? 'n' : cp == '\r' ? 'r' : 't');
            else if (cp < 0x80)
                snprintf(esc, sizeof(esc), "\\x%02x", (unsigned)cp);
            else
                snprintf(esc, sizeof(esc), "\\u{%x}", (unsigned)cp);
            piece = esc;
            plen = strlen(esc);
        }
        if (!put(buf, len, &used, piece, plen)) {
            memcpy(buf + used, "...", 4);
            return buf;
        }
        p += n;
    }
    return buf;
}

json_t *graftctl_json_text(const char *s)
{
    if (s == NULL)
        return json_string("");
    json_t *j = json_string(s); /* NULL when s is not valid UTF-8 */
    if (j != NULL)
        return j;
    char buf[4096];
    return json_string(graftctl_text(s, buf, sizeof(buf)));
}
