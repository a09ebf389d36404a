/* SPDX-License-Identifier: MIT */
/*
 * nvm-bench: latency and IOPS of 4 KiB random reads through libnvm (queue depths 1/8/32, 1-4
 * queues with one thread each, p50/p99 per command), against the kernel nvme driver's baseline
 * on the same controller in the same run (O_DIRECT 4 KiB reads, 1 thread, QD1).
 *
 *   nvm-bench --bdf BDF [--path module|userspace] [options]   kernel baseline, then our path:
 *             the controller is bound to nvme for the baseline, then to "libnvm helper" (module)
 *             or to no driver (userspace: sysfs resource0 + pagemap), and back to nvme at the end
 *   nvm-bench --ctrl /dev/libnvmN|BDF [options]               our path only, controller as it is
 * Options: --ns N (1), --time-ms MS per point (1000), --qd LIST (1,8,32), --queues LIST (1,2,3,4),
 *          --area-mib MIB (64; reads land in the first MIB of the namespace), --seed N,
 *          --require-goals (exit 3 when a goal below does not hold).
 *
 * Our loop: fill every free slot, one SQ doorbell for the batch; poll the CQ, take every entry
 * that is there, one CQ doorbell; repeat. A command's latency runs from just before its batch's
 * doorbell to the poll that saw its completion.
 * Goals (issue 32, reported; TCG timings are only relative): our QD32 >= 5x the kernel's 1-thread
 * IOPS, our QD32 >= 10x our own QD1 (both on one queue).
 * Exit status: 0; 1 setup or I/O failure; 2 bad option; 3 a goal failed under --require-goals.
 */
#define _GNU_SOURCE
#include "nvmtool.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <glob.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#define IO_BYTES 4096u
#define MAX_QUEUES 4
#define MAX_QD 63
#define HELPER "libnvm helper"

/* ---- driver switching (sysfs) ------------------------------------------------------------- */

static int sysfs_write(const char* path, const char* value)
{
    int fd = open(path, O_WRONLY);
    int err = 0;
    if (fd < 0) {
        return errno;
    }
    if (write(fd, value, strlen(value)) < 0) {
        err = errno;
    }
    close(fd);
    return err;
}

/* Name of the driver bound to bdf ("" if none). */
static void driver_of(const char* bdf, char* out, size_t len)
{
    char path[256], link[512];
    ssize_t n;
    snprintf(path, sizeof(path), "/sys/bus/pci/devices/%s/driver", bdf);
    n = readlink(path, link, sizeof(link) - 1);
    out[0] = '\0';
    if (n > 0) {
        link[n] = '\0';
        const char* s = strrchr(link, '/');
        s = s ? s + 1 : link;
        if (strlen(s) < len) {
            memcpy(out, s, strlen(s) + 1);
        }
    }
}

/* Binds bdf to `driver` (override set so that nothing else takes it; "" = no driver). */
static int bind_to(const char* bdf, const char* driver)
{
    char path[256], cur[128], value[160];
    int rc;
    driver_of(bdf, cur, sizeof(cur));
    if (strcmp(cur, driver) == 0 && *driver) {
        return 0;
    }
    snprintf(path, sizeof(path), "/sys/bus/pci/devices/%s/driver_override", bdf);
    /* nvme: no override; the helper: only it; none: a name no driver has. */
    snprintf(value, sizeof(value), "%s\n",
             strcmp(driver, "nvme") == 0 ? "" : *driver ? driver : "libnvm-none");
    if ((rc = sysfs_write(path, value)) != 0) {
        fprintf(stderr, "Cannot write %s: %s\n", path, strerror(rc));
        return rc;
    }
    if (*cur) {
        snprintf(path, sizeof(path), "/sys/bus/pci/devices/%s/driver/unbind", bdf);
        if ((rc = sysfs_write(path, bdf)) != 0) {
            fprintf(stderr, "Cannot unbind %s from %s: %s\n", bdf, cur, strerror(rc));
            return rc;
        }
    }
    if (*driver) {
        snprintf(path, sizeof(path), "/sys/bus/pci/drivers/%s/bind", driver);
        if ((rc = sysfs_write(path, bdf)) != 0) {
            fprintf(stderr, "Cannot bind %s to %s: %s%s\n", bdf, driver, strerror(rc),
                    strcmp(driver, HELPER) == 0 ? " (is the libnvm module loaded?)" : "");
            return rc;
        }
    }
    return 0;
}

/* The first path matching pattern, waiting up to 20 s for it to appear. */
static int wait_glob(const char* pattern, char* out, size_t len)
{
    for (int i = 0; i < 200; ++i) {
        glob_t g;
        if (glob(pattern, 0, NULL, &g) == 0 && g.gl_pathc > 0) {
            snprintf(out, len, "%s", g.gl_pathv[0]);
            globfree(&g);
            return 0;
        }
        globfree(&g);
        usleep(100000);
    }
    fprintf(stderr, "Nothing matches %s after 20 s\n", pattern);
    return ENOENT;
}

/* Binds nvme and returns its namespace's block device (/dev/nvmeXn1). */
static int kernel_bind(const char* bdf, char* dev, size_t len)
{
    char pattern[256], path[512];
    int rc = bind_to(bdf, "nvme");
    if (rc != 0) {
        return rc;
    }
    snprintf(pattern, sizeof(pattern), "/sys/bus/pci/devices/%s/nvme/nvme*/nvme*n1", bdf);
    if ((rc = wait_glob(pattern, path, sizeof(path))) != 0) {
        return rc;
    }
    snprintf(dev, len, "/dev/%s", strrchr(path, '/') + 1);
    for (int i = 0; i < 100 && access(dev, R_OK) != 0; ++i) {
        usleep(100000);
    }
    return access(dev, R_OK) == 0 ? 0 : ENOENT;
}

/* Binds the helper module and returns its node (made with mknod if devtmpfs did not). */
static int helper_bind(const char* bdf, char* node, size_t len)
{
    char pattern[256], path[512], num[32];
    unsigned ma, mi;
    int rc = bind_to(bdf, HELPER);
    if (rc != 0) {
        return rc;
    }
    snprintf(pattern, sizeof(pattern), "/sys/bus/pci/devices/%s/" HELPER "/libnvm*/dev", bdf);
    if ((rc = wait_glob(pattern, path, sizeof(path))) != 0) {
        return rc;
    }
    FILE* f = fopen(path, "r");
    if (f == NULL || fgets(num, sizeof(num), f) == NULL || sscanf(num, "%u:%u", &ma, &mi) != 2) {
        if (f) {
            fclose(f);
        }
        fprintf(stderr, "Cannot read %s\n", path);
        return EIO;
    }
    fclose(f);
    *strrchr(path, '/') = '\0';
    snprintf(node, len, "/dev/%s", strrchr(path, '/') + 1);
    struct stat st;
    if (stat(node, &st) != 0 && mknod(node, S_IFCHR | 0600, makedev(ma, mi)) != 0) {
        rc = errno;
        fprintf(stderr, "mknod %s: %s\n", node, strerror(rc));
        return rc;
    }
    return 0;
}

/* ---- statistics ----------------------------------------------------------------------------- */

struct lat {
    uint32_t* ns; /* latencies in ns (capped at 4 s) */
    size_t n, cap;
};

static int lat_add(struct lat* l, uint64_t ns)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 4096;
        uint32_t* p = realloc(l->ns, cap * sizeof(uint32_t));
        if (p == NULL) {
            return ENOMEM;
        }
        l->ns = p;
        l->cap = cap;
    }
    l->ns[l->n++] = ns > 0xffffffffULL ? 0xffffffffU : (uint32_t) ns;
    return 0;
}

static int cmp_u32(const void* a, const void* b)
{
    uint32_t x = *(const uint32_t*) a, y = *(const uint32_t*) b;
    return x < y ? -1 : x > y;
}

struct result {
    double iops, p50_us, p99_us;
    size_t n;
};

static struct result summarize(struct lat* all, int parts, uint64_t elapsed_ns)
{
    struct result r = { 0, 0, 0, 0 };
    struct lat m = { NULL, 0, 0 };
    for (int i = 0; i < parts; ++i) {
        for (size_t j = 0; j < all[i].n; ++j) {
            lat_add(&m, all[i].ns[j]);
        }
    }
    r.n = m.n;
    if (m.n > 0) {
        qsort(m.ns, m.n, sizeof(uint32_t), cmp_u32);
        r.p50_us = m.ns[(m.n - 1) * 50 / 100] / 1e3;
        r.p99_us = m.ns[(m.n - 1) * 99 / 100] / 1e3;
        r.iops = (double) m.n / ((double) elapsed_ns / 1e9);
    }
    free(m.ns);
    return r;
}

static uint64_t xorshift(uint64_t* s)
{
    uint64_t x = *s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *s = x;
}

/* ---- kernel baseline -------------------------------------------------------------------------- */

static int kernel_run(const char* dev, uint64_t area, uint64_t time_ms, uint64_t seed, struct result* res)
{
    struct lat l = { NULL, 0, 0 };
    void* buf = NULL;
    int fd = open(dev, O_RDONLY | O_DIRECT);
    if (fd < 0) {
        int rc = errno;
        fprintf(stderr, "Failed to open %s with O_DIRECT: %s\n", dev, strerror(rc));
        return rc;
    }
    if (posix_memalign(&buf, IO_BYTES, IO_BYTES) != 0) {
        close(fd);
        return ENOMEM;
    }
    uint64_t s = seed | 1, slots = area / IO_BYTES;
    for (int i = 0; i < 32; ++i) { /* warm up */
        if (pread(fd, buf, IO_BYTES, (off_t) ((xorshift(&s) % slots) * IO_BYTES)) != IO_BYTES) {
            break;
        }
    }
    uint64_t t0 = tool_now_ns(), end = t0 + time_ms * 1000000ULL, t1 = t0;
    int rc = 0;
    while (t1 < end) {
        off_t off = (off_t) ((xorshift(&s) % slots) * IO_BYTES);
        uint64_t a = tool_now_ns();
        ssize_t n = pread(fd, buf, IO_BYTES, off);
        t1 = tool_now_ns();
        if (n != IO_BYTES) {
            rc = n < 0 ? errno : EIO;
            fprintf(stderr, "pread %s at %lld: %s\n", dev, (long long) off, n < 0 ? strerror(rc) : "short read");
            break;
        }
        if (lat_add(&l, t1 - a) != 0) {
            rc = ENOMEM;
            break;
        }
    }
    *res = summarize(&l, 1, t1 - t0);
    free(l.ns);
    free(buf);
    close(fd);
    return rc;
}

/* ---- our path ----------------------------------------------------------------------------------- */

struct worker {
    struct tool_qp qp;
    struct tool_buf data; /* MAX_QD pages, one per tag */
    uint32_t ns_id;
    uint64_t blks_per_io, slots, seed, end_ns, timeout_ms;
    unsigned qd;
    struct lat lat;
    int status;           /* first failure: errno or packed NVMe status */
    pthread_t thread;
};

static void* worker_run(void* arg)
{
    struct worker* w = arg;
    nvm_queue_t* sq = &w->qp.sq;
    nvm_queue_t* cq = &w->qp.cq;
    uint64_t t_sub[MAX_QD];
    uint16_t free_tags[MAX_QD];
    unsigned n_free = w->qd, inflight = 0;
    uint64_t s = w->seed | 1;
    size_t ps = w->data.size / MAX_QD;

    for (unsigned i = 0; i < w->qd; ++i) {
        free_tags[i] = (uint16_t) (w->qd - 1 - i);
    }
    w->lat.n = 0;
    for (;;) {
        uint64_t now = tool_now_ns();
        unsigned batch = 0;
        uint16_t new_tags[MAX_QD];
        if (now < w->end_ns && w->status == 0) {
            while (n_free > 0) {
                nvm_cmd_t* cmd = nvm_sq_enqueue(sq);
                if (cmd == NULL) {
                    break;
                }
                uint16_t tag = free_tags[--n_free];
                uint64_t lba = (xorshift(&s) % w->slots) * w->blks_per_io;
                nvm_cmd_header(cmd, tag, NVM_IO_READ, w->ns_id);
                nvm_cmd_data_ptr(cmd, w->data.win->ioaddrs[(size_t) tag * (IO_BYTES / ps)], 0);
                nvm_cmd_rw_blks(cmd, lba, (uint16_t) w->blks_per_io);
                new_tags[batch++] = tag;
            }
        }
        if (batch > 0) {
            uint64_t t = tool_now_ns();
            for (unsigned i = 0; i < batch; ++i) {
                t_sub[new_tags[i]] = t;
            }
            nvm_sq_submit(sq); /* one doorbell for the batch */
            inflight += batch;
        }
        if (inflight == 0) {
            break;
        }
        nvm_cpl_t* cpl;
        uint64_t wait_start = tool_now_ns();
        while ((cpl = nvm_cq_dequeue(cq)) == NULL) {
            if (tool_now_ns() - wait_start > w->timeout_ms * 1000000ULL) {
                fprintf(stderr, "queue %u: no completion within %llu ms (%u in flight)\n", sq->no,
                        (unsigned long long) w->timeout_ms, inflight);
                w->status = ETIME;
                return NULL;
            }
        }
        uint64_t t = tool_now_ns();
        do {
            uint16_t tag = *NVM_CPL_CID(cpl);
            if (tag >= w->qd) {
                fprintf(stderr, "queue %u: completion with unknown CID %u\n", sq->no, tag);
                w->status = EPROTO;
                return NULL;
            }
            if (!NVM_ERR_OK(cpl) && w->status == 0) {
                w->status = NVM_ERR_STATUS(cpl);
                fprintf(stderr, "queue %u: read failed: %s\n", sq->no, nvm_strerror(w->status));
            }
            if (lat_add(&w->lat, t - t_sub[tag]) != 0 && w->status == 0) {
                w->status = ENOMEM;
            }
            free_tags[n_free++] = tag;
            --inflight;
            nvm_sq_update(sq);
        } while ((cpl = nvm_cq_dequeue(cq)) != NULL);
        nvm_cq_update(cq); /* one doorbell for all completions taken */
    }
    return NULL;
}

/* Runs nq workers at depth qd for time_ms; returns 0 or the first failure. */
static int ours_run(struct worker* ws, unsigned nq, unsigned qd, uint64_t time_ms, struct result* res)
{
    struct lat parts[MAX_QUEUES];
    uint64_t t0 = tool_now_ns();
    int rc = 0;
    for (unsigned i = 0; i < nq; ++i) {
        ws[i].qd = qd;
        ws[i].status = 0;
        ws[i].end_ns = t0 + time_ms * 1000000ULL;
        if (pthread_create(&ws[i].thread, NULL, worker_run, &ws[i]) != 0) {
            fprintf(stderr, "pthread_create failed\n");
            for (unsigned j = 0; j < i; ++j) {
                pthread_join(ws[j].thread, NULL);
            }
            return EAGAIN;
        }
    }
    for (unsigned i = 0; i < nq; ++i) {
        pthread_join(ws[i].thread, NULL);
        if (ws[i].status != 0 && rc == 0) {
            rc = ws[i].status;
        }
        parts[i] = ws[i].lat;
    }
    *res = summarize(parts, (int) nq, tool_now_ns() - t0);
    return rc;
}

/* ---- main ------------------------------------------------------------------------------------- */

static int parse_list(const char* s, unsigned* out, int max_n, unsigned lo, unsigned hi)
{
    int n = 0;
    char buf[128];
    snprintf(buf, sizeof(buf), "%s", s);
    for (char* tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
        uint64_t v;
        if (n == max_n || tool_parse_u64(tok, &v) != 0 || v < lo || v > hi) {
            return -1;
        }
        out[n++] = (unsigned) v;
    }
    return n;
}

static void usage(const char* name)
{
    fprintf(stderr,
            "Usage: %s (--bdf BDF [--path module|userspace] | --ctrl /dev/libnvmN|BDF) [--ns N]\n"
            "          [--time-ms MS] [--qd LIST] [--queues LIST] [--area-mib MIB] [--seed N] [--require-goals]\n"
            "  --bdf BDF        measure the kernel nvme driver (O_DIRECT, 1 thread, QD1) first, then our\n"
            "                   path; the controller is rebound as needed and given back to nvme\n"
            "  --path P         our path with --bdf: module (default; needs libnvm.ko) or userspace\n"
            "  --ctrl PATH      our path only, on a controller already bound to the helper or unbound\n"
            "  --time-ms MS     time per measurement (default 1000)\n"
            "  --qd LIST        queue depths, 1..%d (default 1,8,32)\n"
            "  --queues LIST    queue counts, 1..%d, one thread each (default 1,2,3,4)\n"
            "  --area-mib MIB   random 4 KiB reads within the first MIB of the namespace (default 64)\n"
            "  --require-goals  exit 3 unless QD32 >= 5x kernel and QD32 >= 10x QD1\n",
            name, MAX_QD, MAX_QUEUES);
}

int main(int argc, char** argv)
{
    static const struct option opts[] = {
        { "bdf", required_argument, NULL, 'b' },     { "path", required_argument, NULL, 'p' },
        { "ctrl", required_argument, NULL, 'c' },    { "ns", required_argument, NULL, 'n' },
        { "time-ms", required_argument, NULL, 't' }, { "qd", required_argument, NULL, 'd' },
        { "queues", required_argument, NULL, 'q' },  { "area-mib", required_argument, NULL, 'a' },
        { "seed", required_argument, NULL, 's' },    { "require-goals", no_argument, NULL, 'g' },
        { "help", no_argument, NULL, 'h' },          { NULL, 0, NULL, 0 },
    };
    char bdf[32] = "", ctrl_arg[256] = "";
    int module_path = 1, require = 0, opt, n_qd = 3, n_nq = 4;
    unsigned qds[8] = { 1, 8, 32 }, nqs[8] = { 1, 2, 3, 4 };
    uint64_t ns_id = 1, time_ms = 1000, area_mib = 64, seed = 0x2545F4914F6CDD1DULL, v;

    while ((opt = getopt_long(argc, argv, "b:p:c:n:t:d:q:a:s:gh", opts, NULL)) != -1) {
        switch (opt) {
        case 'b':
            if (tool_parse_bdf(optarg, bdf, sizeof(bdf)) != 0) {
                fprintf(stderr, "Invalid PCI address: %s\n", optarg);
                return 2;
            }
            break;
        case 'p':
            if (strcmp(optarg, "module") == 0) {
                module_path = 1;
            } else if (strcmp(optarg, "userspace") == 0) {
                module_path = 0;
            } else {
                fprintf(stderr, "--path is module or userspace\n");
                return 2;
            }
            break;
        case 'c': snprintf(ctrl_arg, sizeof(ctrl_arg), "%s", optarg); break;
        case 'n':
            if (tool_parse_u64(optarg, &ns_id) != 0 || ns_id == 0 || ns_id > 0xffffffffULL) {
                fprintf(stderr, "Invalid namespace: %s\n", optarg);
                return 2;
            }
            break;
        case 't':
            if (tool_parse_u64(optarg, &time_ms) != 0 || time_ms == 0 || time_ms > 3600000) {
                fprintf(stderr, "Invalid --time-ms: %s\n", optarg);
                return 2;
            }
            break;
        case 'd':
            if ((n_qd = parse_list(optarg, qds, 8, 1, MAX_QD)) <= 0) {
                fprintf(stderr, "Invalid --qd: %s (1..%d, comma-separated)\n", optarg, MAX_QD);
                return 2;
            }
            break;
        case 'q':
            if ((n_nq = parse_list(optarg, nqs, 8, 1, MAX_QUEUES)) <= 0) {
                fprintf(stderr, "Invalid --queues: %s (1..%d, comma-separated)\n", optarg, MAX_QUEUES);
                return 2;
            }
            break;
        case 'a':
            if (tool_parse_u64(optarg, &area_mib) != 0 || area_mib == 0 || area_mib > (1ULL << 30)) {
                fprintf(stderr, "Invalid --area-mib: %s\n", optarg);
                return 2;
            }
            break;
        case 's':
            if (tool_parse_u64(optarg, &v) != 0) {
                fprintf(stderr, "Invalid --seed: %s\n", optarg);
                return 2;
            }
            seed = v;
            break;
        case 'g': require = 1; break;
        case 'h': usage(argv[0]); return 0;
        default: usage(argv[0]); return 2;
        }
    }
    if (optind != argc || (!*bdf) == (!*ctrl_arg)) {
        fprintf(stderr, "Give exactly one of --bdf and --ctrl\n");
        usage(argv[0]);
        return 2;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);

    uint64_t area = area_mib << 20;
    struct result kres = { 0, 0, 0, 0 };
    int have_kernel = 0, ret = 1, rc;
    char dev[256];

    if (*bdf) {
        char kdev[256];
        if (kernel_bind(bdf, kdev, sizeof(kdev)) != 0) {
            fprintf(stderr, "No nvme block device for %s\n", bdf);
            goto restore;
        }
        rc = kernel_run(kdev, area, time_ms, seed, &kres);
        if (rc != 0) {
            goto restore;
        }
        have_kernel = 1;
        printf("kernel  %-22s queues 1  qd  1: %8.0f IOPS  p50 %8.1f us  p99 %8.1f us  (%zu reads)\n",
               kdev, kres.iops, kres.p50_us, kres.p99_us, kres.n);
        if (module_path) {
            if (helper_bind(bdf, dev, sizeof(dev)) != 0) {
                goto restore;
            }
        } else {
            if (bind_to(bdf, "") != 0) {
                goto restore;
            }
            snprintf(dev, sizeof(dev), "%s", bdf);
        }
    } else {
        snprintf(dev, sizeof(dev), "%s", ctrl_arg);
    }

    struct tool_ctrl t;
    struct worker ws[MAX_QUEUES];
    struct nvm_ns_info ns;
    unsigned made = 0, max_nq = 0;
    memset(ws, 0, sizeof(ws));
    for (int i = 0; i < n_nq; ++i) {
        max_nq = nqs[i] > max_nq ? nqs[i] : max_nq;
    }
    if (tool_open(&t, dev) != 0 || tool_admin(&t) != 0 || tool_ns_info(&t, (uint32_t) ns_id, &ns) != 0) {
        goto close;
    }
    if (ns.lba_data_size == 0 || ns.lba_data_size > IO_BYTES || IO_BYTES % ns.lba_data_size || ns.size == 0) {
        fprintf(stderr, "Namespace %llu: block size %zu does not divide 4 KiB or namespace inactive\n",
                (unsigned long long) ns_id, ns.lba_data_size);
        goto close;
    }
    if (area > ns.size * ns.lba_data_size) {
        area = ns.size * ns.lba_data_size;
    }
    if (area < IO_BYTES) {
        fprintf(stderr, "Namespace too small\n");
        goto close;
    }
    uint16_t ncq = (uint16_t) max_nq, nsq = (uint16_t) max_nq;
    if ((rc = nvm_admin_request_num_queues(t.aq, &ncq, &nsq)) != 0 || ncq < max_nq || nsq < max_nq) {
        fprintf(stderr, "Controller grants %u/%u queues, %u needed: %s\n", ncq, nsq, max_nq, nvm_strerror(rc));
        goto close;
    }
    for (; made < max_nq; ++made) {
        struct worker* w = &ws[made];
        if (tool_qp_create(&t, &w->qp, (uint16_t) (made + 1), 0) != 0 ||
            tool_buf_new(&t, &w->data, (size_t) MAX_QD * t.ps) != 0) {
            goto close;
        }
        if (w->qp.sq.max_entries <= MAX_QD || t.ps < IO_BYTES) {
            fprintf(stderr, "SQ of %u entries is too small for depth %d\n", w->qp.sq.max_entries, MAX_QD);
            goto close;
        }
        w->ns_id = (uint32_t) ns_id;
        w->blks_per_io = IO_BYTES / ns.lba_data_size;
        w->slots = area / IO_BYTES;
        w->seed = seed + 0x9E3779B97F4A7C15ULL * (made + 1);
        w->timeout_ms = t.ctrl->timeout ? t.ctrl->timeout : 10000;
    }
    printf("# nvm-bench: %s via %s, namespace %llu, 4 KiB random reads over %llu MiB, %llu ms per point\n", dev,
           t.module ? "the helper module" : "sysfs resource0 + pagemap", (unsigned long long) ns_id,
           (unsigned long long) (area >> 20), (unsigned long long) time_ms);

    double qd1 = 0, qd32 = 0;
    for (int i = 0; i < n_qd; ++i) {
        for (int j = 0; j < n_nq; ++j) {
            struct result r;
            rc = ours_run(ws, nqs[j], qds[i], time_ms, &r);
            if (rc != 0) {
                fprintf(stderr, "Benchmark failed at %u queues, depth %u: %s\n", nqs[j], qds[i], nvm_strerror(rc));
                goto close;
            }
            printf("libnvm  %-22s queues %u  qd %2u: %8.0f IOPS  p50 %8.1f us  p99 %8.1f us  (%zu reads)\n",
                   t.module ? "module" : "userspace", nqs[j], qds[i], r.iops, r.p50_us, r.p99_us, r.n);
            if (nqs[j] == 1 && qds[i] == 1) {
                qd1 = r.iops;
            }
            if (nqs[j] == 1 && qds[i] == 32) {
                qd32 = r.iops;
            }
        }
    }
    ret = 0;
    int goals_ok = 1;
    if (qd32 > 0 && have_kernel && kres.iops > 0) {
        double x = qd32 / kres.iops;
        printf("ratio our QD32 / kernel 1-thread QD1 IOPS: %.2f (goal >= 5: %s)\n", x, x >= 5 ? "met" : "NOT met");
        goals_ok &= x >= 5;
    } else {
        printf("ratio our QD32 / kernel 1-thread QD1 IOPS: not measured (needs --bdf and 1 queue at QD 32)\n");
        goals_ok = 0;
    }
    if (qd32 > 0 && qd1 > 0) {
        double x = qd32 / qd1;
        printf("ratio our QD32 / our QD1 IOPS: %.2f (goal >= 10: %s)\n", x, x >= 10 ? "met" : "NOT met");
        goals_ok &= x >= 10;
    } else {
        printf("ratio our QD32 / our QD1 IOPS: not measured (needs 1 queue at QD 1 and 32)\n");
        goals_ok = 0;
    }
    if (require && !goals_ok) {
        ret = 3;
    }
close:
    for (unsigned i = 0; i < MAX_QUEUES; ++i) {
        if (ws[i].qp.mem.win != NULL) {
            tool_qp_delete(&t, &ws[i].qp);
        }
        tool_buf_free(&ws[i].data);
        free(ws[i].lat.ns);
    }
    tool_close(&t);
restore:
    if (*bdf) {
        char drv[128];
        if (kernel_bind(bdf, dev, sizeof(dev)) != 0) {
            fprintf(stderr, "Could not give %s back to nvme\n", bdf);
            ret = 1;
        } else {
            driver_of(bdf, drv, sizeof(drv));
            fprintf(stderr, "%s is bound to %s again (%s)\n", bdf, drv, dev);
        }
    }
    return ret;
}
