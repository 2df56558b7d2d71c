#include <graft/common.h>

const char *graft_status_string(graft_status_t status)
{
    switch (status) {
#define GRAFT__STATUS_MSG(name, value, cls, msg)                                         \
    case GRAFT_##name:                                                                   \
        return msg;
        GRAFT_STATUS_MAP(GRAFT__STATUS_MSG)
#undef GRAFT__STATUS_MSG
    }
    return "unknown status";
}

const char *graft_status_name(graft_status_t status)
{
    switch (status) {
#define GRAFT__STATUS_NAME(name, value, cls, msg)                                        \
    case GRAFT_##name:                                                                   \
        return "GRAFT_" #name;
        GRAFT_STATUS_MAP(GRAFT__STATUS_NAME)
#undef GRAFT__STATUS_NAME
    }
    return "GRAFT_UNKNOWN";
}

graft_status_class_t graft_status_class(graft_status_t status)
{
    switch (status) {
#define GRAFT__STATUS_CLASS(name, value, cls, msg)                                       \
    case GRAFT_##name:                                                                   \
        return GRAFT_CLASS_##cls;
        GRAFT_STATUS_MAP(GRAFT__STATUS_CLASS)
#undef GRAFT__STATUS_CLASS
    }
    return status == 0 ? GRAFT_CLASS_NONE : GRAFT_CLASS_SYSTEM;
}

const char *graft_status_class_string(graft_status_class_t cls)
{
    switch (cls) {
    case GRAFT_CLASS_NONE:
        return "none";
    case GRAFT_CLASS_USAGE:
        return "usage";
    case GRAFT_CLASS_SYSTEM:
        return "system";
    case GRAFT_CLASS_CHUNK:
        return "chunk";
    case GRAFT_CLASS_PEER:
        return "peer";
    case GRAFT_CLASS_GROUP:
        return "group";
    case GRAFT_CLASS_JOB:
        return "job";
    }
    return "unknown";
}

const char *graft_version_string(void)
{
    return GRAFT_VERSION;
}
