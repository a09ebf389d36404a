/*
 * nccl_uid.c: the smallest real NCCL consumer. It dlopens libnccl.so.2 (from the PyPI wheel) and
 * calls ncclGetUniqueId, inside which NCCL initialises its GDRCOPY wrapper when
 * NCCL_GDRCOPY_ENABLE=1: dlopen("libgdrapi.so"), dlsym of the gdr_* entry points, gdr_open,
 * version checks. No GPU is needed for that part. Usage: nccl_uid /path/to/libnccl.so.2
 * Declares the three NCCL functions it uses itself (nccl.h needs the CUDA runtime headers).
 */
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

typedef struct {
    char internal[128]; /* NCCL_UNIQUE_ID_BYTES */
} nccl_unique_id;

int main(int argc, char **argv)
{
    void *h, *p;
    int (*get_unique_id)(nccl_unique_id *);
    int (*get_version)(int *);
    const char *(*error_string)(int);
    nccl_unique_id id;
    int version = 0, rc;

    if (argc != 2) {
        fprintf(stderr, "usage: %s libnccl.so.2\n", argv[0]);
        return 2;
    }
    h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        fprintf(stderr, "dlopen(%s): %s\n", argv[1], dlerror());
        return 2;
    }
    p = dlsym(h, "ncclGetUniqueId");
    memcpy(&get_unique_id, &p, sizeof(p));
    p = dlsym(h, "ncclGetVersion");
    memcpy(&get_version, &p, sizeof(p));
    p = dlsym(h, "ncclGetErrorString");
    memcpy(&error_string, &p, sizeof(p));
    if (!get_unique_id || !get_version || !error_string) {
        fprintf(stderr, "libnccl lacks ncclGetUniqueId/ncclGetVersion/ncclGetErrorString\n");
        return 2;
    }
    get_version(&version);
    printf("nccl version %d\n", version);
    memset(&id, 0, sizeof(id));
    rc = get_unique_id(&id);
    printf("ncclGetUniqueId = %d (%s)\n", rc, error_string(rc));
    return rc == 0 ? 0 : 1;
}
