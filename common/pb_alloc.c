/* The protobuf-c allocator over graft's allocation hooks (pb_alloc.h). */
#include "pb_alloc.h"

#include "graft_internal.h"

static void *pb_alloc(void *arg, size_t size)
{
    void *p = graft__malloc(size);
    if (p == NULL && arg != NULL)
        *(bool *)arg = true;
    return p;
}

static void pb_free(void *arg, void *ptr)
{
    (void)arg;
    graft_free(ptr);
}

ProtobufCAllocator graft__pb_allocator = {pb_alloc, pb_free, NULL};

ProtobufCAllocator graft__pb_allocator_tracked(bool *oom)
{
    ProtobufCAllocator a = {pb_alloc, pb_free, oom};
    return a;
}
