/*
 * LD_PRELOAD shim for the negative test: a gdr_copy_to_mapping that silently leaves out the last
 * byte of every copy (and reports success), standing in for a broken copy engine. The data
 * check must fail with it loaded, or it proves nothing.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <gdrapi.h>
#include <stddef.h>

typedef int (*copy_to_mapping_fn)(gdr_mh_t, void *, const void *, size_t);

int gdr_copy_to_mapping(gdr_mh_t handle, void *map_d_ptr, const void *h_ptr, size_t size)
{
    static copy_to_mapping_fn real;
    if (real == NULL) {
        /* UCX dlopens its gdr_copy module, so our library is in that module's local scope,
         * out of RTLD_NEXT's reach: look it up by soname (already loaded by then). */
        void *lib = dlopen("libgdrapi.so.2", RTLD_LAZY | RTLD_NOLOAD);
        if (lib != NULL)
            real = (copy_to_mapping_fn)dlsym(lib, "gdr_copy_to_mapping");
    }
    if (real == NULL)
        return -1;
    return real(handle, map_d_ptr, h_ptr, size > 0 ? size - 1 : 0);
}
