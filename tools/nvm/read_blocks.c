/* SPDX-License-Identifier: MIT */
/*
 * nvm-read-blocks: read a block range with libnvm into host memory or GPU memory and write it to
 * a file (or dump it), as upstream's nvm-read-blocks, plus --gpu.
 *
 *   nvm-read-blocks --ctrl PATH --blocks N [--offset B] [--ns ID] [--chunk N]
 *                   [--output FILE | --ascii] [--identify] [--gpu[=DEV]]
 *
 * PATH is /dev/libnvmN (helper module) or a PCI address (module-free, host memory only).
 * --gpu reads into memory from cuMemAlloc (libcuda.so.1 loaded at run time; in the VM cudasim
 * over gpusim), mapped with nvm_dma_map_device through the module, then copied to the host with
 * cuMemcpyDtoH for the output. Each chunk (default: everything) is read with as many commands
 * as needed (each up to MDTS and one PRP list page), all in flight at once up to the SQ size,
 * one doorbell per batch.
 * Exit status: 0; 1 controller, I/O or file failure; 2 bad option or number.
 */
#include "nvmtool.h"

#include <dlfcn.h>
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- GPU memory through the CUDA driver API, loaded at run time ------------------------------ */
typedef int cu_result;
typedef unsigned long long cu_devptr;
static struct {
    void* lib;
    cu_result (*init)(unsigned);
    cu_result (*device_get)(int*, int);
    cu_result (*primary_retain)(void**, int);
    cu_result (*primary_release)(int);
    cu_result (*ctx_set_current)(void*);
    cu_result (*mem_alloc)(cu_devptr*, size_t);
    cu_result (*mem_free)(cu_devptr);
    cu_result (*memcpy_dtoh)(void*, cu_devptr, size_t);
    int dev;
} cu;

#define GPU_PAGE ((size_t) 0x10000)

static int cuda_load(int ordinal)
{
    void* ctx = NULL;
    cu_result r;
    cu.lib = dlopen("libcuda.so.1", RTLD_NOW);
    if (cu.lib == NULL) {
        fprintf(stderr, "--gpu needs the CUDA driver: %s\n", dlerror());
        return 1;
    }
#define SYM(field, name) \
    if ((*(void**) &cu.field = dlsym(cu.lib, name)) == NULL) { \
        fprintf(stderr, "libcuda.so.1 lacks %s\n", name); \
        return 1; \
    }
    SYM(init, "cuInit");
    SYM(device_get, "cuDeviceGet");
    SYM(primary_retain, "cuDevicePrimaryCtxRetain");
    SYM(primary_release, "cuDevicePrimaryCtxRelease_v2");
    SYM(ctx_set_current, "cuCtxSetCurrent");
    SYM(mem_alloc, "cuMemAlloc_v2");
    SYM(mem_free, "cuMemFree_v2");
    SYM(memcpy_dtoh, "cuMemcpyDtoH_v2");
#undef SYM
    if ((r = cu.init(0)) != 0 || (r = cu.device_get(&cu.dev, ordinal)) != 0 ||
        (r = cu.primary_retain(&ctx, cu.dev)) != 0 || (r = cu.ctx_set_current(ctx)) != 0) {
        fprintf(stderr, "CUDA device %d unusable: CUresult %d\n", ordinal, r);
        return 1;
    }
    return 0;
}

/* Where the data lands: host memory with a window, or GPU memory with a device window. */
struct data_buf {
    struct tool_buf host;   /* host mode: the data; GPU mode: the bounce buffer (no window) */
    cu_devptr gpu_raw;      /* GPU mode: cuMemAlloc result */
    cu_devptr gpu;          /* 64 KiB aligned start inside it */
    nvm_dma_t* gwin;        /* GPU window */
    const nvm_dma_t* win;   /* the window commands use */
};

static int data_new(struct tool_ctrl* t, struct data_buf* d, size_t size, int gpu)
{
    memset(d, 0, sizeof(*d));
    if (!gpu) {
        int rc = tool_buf_new(t, &d->host, size);
        d->win = d->host.win;
        return rc;
    }
    size_t gsize = (size + GPU_PAGE - 1) & ~(GPU_PAGE - 1);
    cu_result r = cu.mem_alloc(&d->gpu_raw, gsize + GPU_PAGE);
    if (r != 0) {
        fprintf(stderr, "cuMemAlloc(%zu) failed: CUresult %d\n", gsize + GPU_PAGE, r);
        return ENOMEM;
    }
    d->gpu = (d->gpu_raw + GPU_PAGE - 1) & ~(cu_devptr) (GPU_PAGE - 1);
    int rc = nvm_dma_map_device(&d->gwin, t->ctrl, (void*) (uintptr_t) d->gpu, gsize);
    if (rc != 0) {
        fprintf(stderr, "Failed to map GPU memory: %s\n", nvm_strerror(rc));
        return rc;
    }
    d->win = d->gwin;
    d->host.size = size;
    d->host.va = malloc(size);
    return d->host.va ? 0 : ENOMEM;
}

static void data_free(struct data_buf* d)
{
    if (d->gwin != NULL) {
        nvm_dma_unmap(d->gwin);
    }
    if (d->gpu_raw != 0) {
        cu.mem_free(d->gpu_raw);
        free(d->host.va);
    } else {
        tool_buf_free(&d->host);
    }
}

/* Reads n_blks blocks at lba into the data window from its start; 0 or a packed status. */
static int read_chunk(struct tool_ctrl* t, struct tool_qp* qp, const struct data_buf* d, uint32_t ns_id,
                      size_t blk_size, uint64_t lba, uint64_t n_blks, uint64_t max_cmd_blks)
{
    size_t ps = t->ps;
    uint64_t issued = 0;
    size_t outstanding = 0;
    int status = 0;

    while (issued < n_blks || outstanding > 0) {
        /* Fill the SQ, then one doorbell for the batch. */
        while (issued < n_blks && status == 0) {
            nvm_cmd_t* cmd = nvm_sq_enqueue(&qp->sq);
            if (cmd == NULL) {
                break;
            }
            uint64_t n = n_blks - issued < max_cmd_blks ? n_blks - issued : max_cmd_blks;
            size_t first_page = (size_t) (issued * blk_size / ps);
            size_t pages = (size_t) ((n * blk_size + ps - 1) / ps);
            size_t slot = (size_t) (cmd - (nvm_cmd_t*) qp->sq.vaddr);
            nvm_cmd_header(cmd, NVM_DEFAULT_CID(&qp->sq), NVM_IO_READ, ns_id);
            nvm_cmd_data(cmd, ps, pages, NVM_DMA_OFFSET(qp->mem.win, 2 + slot), qp->mem.win->ioaddrs[2 + slot],
                         d->win->ioaddrs + first_page);
            nvm_cmd_rw_blks(cmd, lba + issued, (uint16_t) n);
            issued += n;
            ++outstanding;
        }
        nvm_sq_submit(&qp->sq);
        if (outstanding == 0) {
            break;
        }
        /* Wait for one completion, then take all that are there; one CQ doorbell. */
        nvm_cpl_t* cpl = nvm_cq_dequeue_block(&qp->cq, t->ctrl->timeout);
        if (cpl == NULL) {
            fprintf(stderr, "Timed out waiting for a read completion (%zu outstanding)\n", outstanding);
            return ETIME;
        }
        do {
            if (!NVM_ERR_OK(cpl) && status == 0) {
                status = NVM_ERR_STATUS(cpl);
                fprintf(stderr, "Read failed: %s\n", nvm_strerror(status));
            }
            nvm_sq_update(&qp->sq);
            --outstanding;
        } while ((cpl = nvm_cq_dequeue(&qp->cq)) != NULL);
        nvm_cq_update(&qp->cq);
        if (status != 0 && outstanding == 0) {
            return status;
        }
    }
    return status;
}

static void dump(FILE* out, const unsigned char* p, size_t len, uint64_t base, int ascii)
{
    size_t i;
    if (ascii) {
        for (i = 0; i < len; ++i) {
            fputc(p[i] >= 0x20 && p[i] < 0x7f ? p[i] : '.', out);
            if (i % 128 == 127) {
                fputc('\n', out);
            }
        }
        if (len % 128) {
            fputc('\n', out);
        }
        return;
    }
    for (i = 0; i < len; ++i) {
        if (i % 32 == 0) {
            fprintf(out, "%8lx: ", (unsigned long) (base + i));
        }
        fprintf(out, " %02x", p[i]);
        if (i % 32 == 31) {
            fputc('\n', out);
        }
    }
    if (len % 32) {
        fputc('\n', out);
    }
}

static void usage(const char* name)
{
    fprintf(stderr,
            "Usage: %s --ctrl PATH --blocks N [--offset B] [--ns ID] [--chunk N] [--output FILE | --ascii]\n"
            "          [--identify] [--gpu[=DEV]]\n"
            "  --ctrl PATH     /dev/libnvmN (helper module) or PCI address [dddd:]bb:dd.f (module-free)\n"
            "  --blocks N      number of blocks to read\n"
            "  --offset B      first block (default 0)\n"
            "  --ns ID         namespace (default 1)\n"
            "  --chunk N       blocks per buffer fill (default: all)\n"
            "  --output FILE   write the data to FILE (default: hex dump on stdout)\n"
            "  --ascii         dump printable characters instead of hex\n"
            "  --identify      print the controller and namespace information\n"
            "  --gpu[=DEV]     read into GPU memory (cuMemAlloc; needs the helper module)\n",
            name);
}

static int number(const char* s, uint64_t* v, const char* what)
{
    if (tool_parse_u64(s, v) != 0) {
        fprintf(stderr, "Invalid %s: %s\n", what, s);
        return 0;
    }
    return 1;
}

int main(int argc, char** argv)
{
    static const struct option opts[] = {
        { "ctrl", required_argument, NULL, 'c' },   { "blocks", required_argument, NULL, 'n' },
        { "offset", required_argument, NULL, 'o' }, { "ns", required_argument, NULL, 's' },
        { "chunk", required_argument, NULL, 'k' },  { "output", required_argument, NULL, 'w' },
        { "ascii", no_argument, NULL, 'a' },        { "identify", no_argument, NULL, 'i' },
        { "gpu", optional_argument, NULL, 'g' },    { "write", required_argument, NULL, 'W' },
        { "help", no_argument, NULL, 'h' },         { NULL, 0, NULL, 0 },
    };
    const char* ctrl_path = NULL;
    const char* out_path = NULL;
    uint64_t blocks = 0, offset = 0, ns_id = 1, chunk = 0, gpu_dev = 0;
    int ascii = 0, identify = 0, gpu = 0, opt, rc, have_blocks = 0;

    while ((opt = getopt_long(argc, argv, "c:n:o:s:k:w:aig::h", opts, NULL)) != -1) {
        switch (opt) {
        case 'c': ctrl_path = optarg; break;
        case 'n': if (!number(optarg, &blocks, "number of blocks") || blocks == 0) return 2; have_blocks = 1; break;
        case 'o': if (!number(optarg, &offset, "offset")) return 2; break;
        case 's': if (!number(optarg, &ns_id, "namespace") || ns_id == 0 || ns_id > 0xffffffffULL) return 2; break;
        case 'k': if (!number(optarg, &chunk, "chunk size") || chunk == 0) return 2; break;
        case 'w': out_path = optarg; break;
        case 'a': ascii = 1; break;
        case 'i': identify = 1; break;
        case 'g':
            gpu = 1;
            if (optarg && (!number(optarg, &gpu_dev, "GPU") || gpu_dev > 1024)) return 2;
            break;
        case 'W':
            fprintf(stderr, "--write is not supported by this tool (it only reads)\n");
            return 2;
        case 'h': usage(argv[0]); return 0;
        default: usage(argv[0]); return 2;
        }
    }
    if (optind != argc || (ascii && out_path)) {
        usage(argv[0]);
        return 2;
    }
    if (ctrl_path == NULL) {
        fprintf(stderr, "Controller is not set (--ctrl)\n");
        usage(argv[0]);
        return 1;
    }
    if (!have_blocks) {
        fprintf(stderr, "Number of blocks is not set (--blocks)\n");
        return 2;
    }

    FILE* out = stdout;
    if (out_path != NULL && (out = fopen(out_path, "wb")) == NULL) {
        fprintf(stderr, "Failed to open %s: %s\n", out_path, strerror(errno));
        return 1;
    }

    struct tool_ctrl t;
    struct tool_qp qp;
    struct data_buf d;
    struct nvm_ctrl_info info;
    struct nvm_ns_info ns;
    int have_qp = 0, have_data = 0, ret = 1;
    memset(&d, 0, sizeof(d));

    if (tool_open(&t, ctrl_path) != 0) {
        goto out;
    }
    if (gpu && !t.module) {
        fprintf(stderr, "--gpu needs the helper module (--ctrl /dev/libnvmN)\n");
        goto out;
    }
    if (gpu && cuda_load((int) gpu_dev) != 0) {
        goto out;
    }
    if (tool_admin(&t) != 0 || tool_ctrl_info(&t, &info) != 0 || tool_ns_info(&t, (uint32_t) ns_id, &ns) != 0) {
        goto out;
    }
    if (identify) {
        uint16_t nc = 0, nsq = 0;
        nvm_admin_get_num_queues(t.aq, &nc, &nsq);
        tool_print_ctrl_info(&info, nc, nsq);
        tool_print_ns_info(&ns);
    }
    if (ns.lba_data_size < 512 || ns.size == 0) {
        fprintf(stderr, "Namespace %llu is not active\n", (unsigned long long) ns_id);
        goto out;
    }
    if (offset >= ns.size || blocks > ns.size - offset) {
        fprintf(stderr, "Blocks %llu..%llu lie outside namespace %llu (%llu blocks)\n", (unsigned long long) offset,
                (unsigned long long) (offset + blocks - 1), (unsigned long long) ns_id, (unsigned long long) ns.size);
        ret = 2;
        goto out;
    }
    uint16_t n_cqs = 1, n_sqs = 1;
    rc = nvm_admin_request_num_queues(t.aq, &n_cqs, &n_sqs);
    if (rc != 0) {
        fprintf(stderr, "Failed to set number of queues: %s\n", nvm_strerror(rc));
        goto out;
    }
    if (tool_qp_create(&t, &qp, 1, 1) != 0) {
        goto out;
    }
    have_qp = 1;

    /* One command: at most MDTS and at most what one PRP list page describes. */
    size_t max_pages = info.max_data_pages;
    if (max_pages == 0 || max_pages > 1 + t.ps / 8) {
        max_pages = 1 + t.ps / 8;
    }
    uint64_t max_cmd_blks = max_pages * t.ps / ns.lba_data_size;
    if (max_cmd_blks > 65536) {
        max_cmd_blks = 65536;
    }
    if (max_cmd_blks == 0) {
        fprintf(stderr, "Block size %zu exceeds one command's transfer\n", ns.lba_data_size);
        goto out;
    }
    if (chunk == 0 || chunk > blocks) {
        chunk = blocks;
    }
    size_t chunk_bytes = (size_t) (chunk * ns.lba_data_size);
    if (data_new(&t, &d, chunk_bytes, gpu) != 0) {
        goto out;
    }
    have_data = 1;

    uint64_t total = blocks * ns.lba_data_size, t0 = tool_now_ns(), io_ns = 0;
    for (uint64_t at = 0; at < blocks; at += chunk) {
        uint64_t n = blocks - at < chunk ? blocks - at : chunk;
        size_t bytes = (size_t) (n * ns.lba_data_size);
        fprintf(stderr, "Reading %zu bytes (total=%llu)\n", bytes, (unsigned long long) total);
        uint64_t s0 = tool_now_ns();
        rc = read_chunk(&t, &qp, &d, (uint32_t) ns_id, ns.lba_data_size, offset + at, n, max_cmd_blks);
        io_ns += tool_now_ns() - s0;
        if (rc != 0) {
            goto out;
        }
        if (gpu) {
            cu_result r = cu.memcpy_dtoh(d.host.va, d.gpu, bytes);
            if (r != 0) {
                fprintf(stderr, "cuMemcpyDtoH failed: CUresult %d\n", r);
                goto out;
            }
        }
        if (out_path != NULL) {
            if (fwrite(d.host.va, 1, bytes, out) != bytes) {
                fprintf(stderr, "Failed to write %s: %s\n", out_path, strerror(errno));
                goto out;
            }
        } else {
            dump(out, d.host.va, bytes, (offset + at) * ns.lba_data_size, ascii);
        }
    }
    uint64_t us = (tool_now_ns() - t0) / 1000;
    fprintf(stderr, "Done in %lluus, %fMB/s\n", (unsigned long long) us,
            io_ns ? (double) total / ((double) io_ns / 1e3) : 0.0);
    ret = 0;
out:
    if (out_path != NULL && out != NULL) {
        fprintf(stderr, "Flushing output file...\n");
        if (fclose(out) != 0 && ret == 0) {
            fprintf(stderr, "Failed to write %s: %s\n", out_path, strerror(errno));
            ret = 1;
        }
    }
    if (have_qp) {
        tool_qp_delete(&t, &qp);
    }
    if (have_data) {
        data_free(&d);
    } else if (d.gpu_raw) {
        data_free(&d);
    }
    tool_close(&t);
    if (cu.lib != NULL) {
        cu.primary_release(cu.dev);
    }
    fprintf(stderr, ret == 0 ? "Done\n" : "Failed\n");
    return ret;
}
