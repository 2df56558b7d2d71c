/*
 * The protobuf-c allocator every module decodes with: it goes through
 * graft's allocation hooks, so allocation-failure tests reach the decoders.
 */
#ifndef GRAFT_PB_ALLOC_H
#define GRAFT_PB_ALLOC_H

#include <protobuf-c/protobuf-c.h>

#include <stdbool.h>

extern ProtobufCAllocator graft__pb_allocator;

/* The same allocator, which also sets *oom when an allocation fails (so a
 * NULL from unpack can be told apart from malformed input). */
ProtobufCAllocator graft__pb_allocator_tracked(bool *oom);

#endif /* GRAFT_PB_ALLOC_H */
