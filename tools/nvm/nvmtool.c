/* SPDX-License-Identifier: MIT */
/* Shared code of the libnvm tools; see nvmtool.h. */
#define _GNU_SOURCE
#include "nvmtool.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

uint64_t tool_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t) ts.tv_sec * 1000000000ULL + (uint64_t) ts.tv_nsec;
}

int tool_parse_u64(const char* s, uint64_t* v)
{
    char* end = NULL;
    unsigned long long x;
    if (s == NULL || *s == '\0' || *s == '-') {
        return EINVAL;
    }
    errno = 0;
    x = strtoull(s, &end, 0);
    if (errno != 0 || end == s || *end != '\0') {
        return EINVAL;
    }
    *v = (uint64_t) x;
    return 0;
}

int tool_parse_bdf(const char* s, char* out, size_t len)
{
    unsigned dom = 0, bus, dev, fn;
    char tail;
    if (sscanf(s, "%x:%x:%x.%x%c", &dom, &bus, &dev, &fn, &tail) == 4) {
        /* dddd:bb:dd.f */
    } else if (sscanf(s, "%x:%x.%x%c", &bus, &dev, &fn, &tail) == 3) {
        dom = 0;
    } else {
        return EINVAL;
    }
    if (dom > 0xffff || bus > 0xff || dev > 0x1f || fn > 7) {
        return EINVAL;
    }
    snprintf(out, len, "%04x:%02x:%02x.%x", dom, bus, dev, fn);
    return 0;
}

/* Physical address of a locked page of this process (root, no IOMMU: bus = physical). */
static uint64_t phys_of(const struct tool_ctrl* t, const void* va)
{
    uint64_t entry = 0;
    off_t off = (off_t) ((uintptr_t) va / t->ps) * 8;
    if (pread(t->pagemap, &entry, 8, off) != 8 || !(entry >> 63) || (entry & ((1ULL << 55) - 1)) == 0) {
        return 0;
    }
    return (entry & ((1ULL << 55) - 1)) * t->ps;
}

static int write_sysfs(const char* path, const char* value)
{
    int fd = open(path, O_WRONLY);
    ssize_t n;
    if (fd < 0) {
        return errno;
    }
    n = write(fd, value, strlen(value));
    int err = n < 0 ? errno : 0;
    close(fd);
    return err;
}

/* Module-free: enable the function, turn on memory decoding and bus mastering, map resource0. */
static int open_sysfs(struct tool_ctrl* t, const char* resource)
{
    char path[512];
    struct stat st;
    uint16_t cmd = 0;
    int fd, rc;

    snprintf(path, sizeof(path), "/sys/bus/pci/devices/%s/enable", t->bdf);
    (void) write_sysfs(path, "1"); /* already enabled is fine; the mapping below tells */
    snprintf(path, sizeof(path), "/sys/bus/pci/devices/%s/config", t->bdf);
    fd = open(path, O_RDWR);
    if (fd >= 0) {
        if (pread(fd, &cmd, 2, 4) == 2 && (cmd & 0x6) != 0x6) {
            cmd |= 0x6; /* memory space + bus master */
            if (pwrite(fd, &cmd, 2, 4) != 2) {
                fprintf(stderr, "Failed to enable bus mastering through %s: %s\n", path, strerror(errno));
            }
        }
        close(fd);
    }
    fd = open(resource, O_RDWR | O_SYNC);
    if (fd < 0) {
        rc = errno;
        fprintf(stderr, "Failed to open %s: %s\n", resource, strerror(rc));
        return rc;
    }
    if (fstat(fd, &st) != 0 || st.st_size < NVM_CTRL_MEM_MINSIZE) {
        close(fd);
        fprintf(stderr, "%s is not a BAR0 of at least 0x%x bytes\n", resource, NVM_CTRL_MEM_MINSIZE);
        return EINVAL;
    }
    t->bar_size = (size_t) st.st_size;
    t->bar = mmap(NULL, t->bar_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    rc = errno;
    close(fd);
    if (t->bar == MAP_FAILED) {
        t->bar = NULL;
        fprintf(stderr, "Failed to map %s: %s (is a driver still bound?)\n", resource, strerror(rc));
        return rc;
    }
    t->pagemap = open("/proc/self/pagemap", O_RDONLY);
    if (t->pagemap < 0) {
        rc = errno;
        fprintf(stderr, "Failed to open /proc/self/pagemap: %s\n", strerror(rc));
        return rc;
    }
    rc = nvm_raw_ctrl_init(&t->ctrl, t->bar, t->bar_size);
    if (rc != 0) {
        fprintf(stderr, "Failed to get controller reference: %s\n", nvm_strerror(rc));
    }
    return rc;
}

int tool_open(struct tool_ctrl* t, const char* spec)
{
    struct stat st;
    size_t n = strlen(spec);
    int fd, rc;

    memset(t, 0, sizeof(*t));
    t->pagemap = -1;
    t->ps = (size_t) sysconf(_SC_PAGESIZE);

    if (stat(spec, &st) == 0 && S_ISCHR(st.st_mode)) {
        t->module = 1;
        fd = open(spec, O_RDWR | O_NONBLOCK);
        if (fd < 0) {
            rc = errno;
            fprintf(stderr, "Failed to open %s: %s\n", spec, strerror(rc));
            return rc;
        }
        rc = nvm_ctrl_init(&t->ctrl, fd);
        close(fd); /* the library keeps its own descriptor */
        if (rc != 0) {
            t->ctrl = NULL;
            fprintf(stderr, "Failed to get controller reference: %s\n", nvm_strerror(rc));
        }
        return rc;
    }
    if (n > 10 && strcmp(spec + n - 10, "/resource0") == 0) {
        /* .../devices/<bdf>/resource0 */
        char tmp[512];
        const char* slash;
        snprintf(tmp, sizeof(tmp), "%.*s", (int) (n - 10), spec);
        slash = strrchr(tmp, '/');
        if (tool_parse_bdf(slash ? slash + 1 : tmp, t->bdf, sizeof(t->bdf)) != 0) {
            fprintf(stderr, "%s: no PCI address before /resource0\n", spec);
            return EINVAL;
        }
        return open_sysfs(t, spec);
    }
    if (tool_parse_bdf(spec, t->bdf, sizeof(t->bdf)) == 0) {
        char res[256];
        snprintf(res, sizeof(res), "/sys/bus/pci/devices/%s/resource0", t->bdf);
        return open_sysfs(t, res);
    }
    fprintf(stderr, "%s is neither a character device (/dev/libnvmN) nor a PCI address ([dddd:]bb:dd.f)\n", spec);
    return ENODEV;
}

int tool_buf_new(struct tool_ctrl* t, struct tool_buf* b, size_t size)
{
    size_t pages, i;
    uint64_t* addrs;
    int rc;

    memset(b, 0, sizeof(*b));
    pages = (size + t->ps - 1) / t->ps;
    if (pages == 0) {
        return EINVAL;
    }
    b->size = pages * t->ps;
    if (posix_memalign(&b->va, t->ps, b->size) != 0) {
        b->va = NULL;
        return ENOMEM;
    }
    memset(b->va, 0, b->size);
    if (t->module) {
        rc = nvm_dma_map_host(&b->win, t->ctrl, b->va, b->size);
        if (rc != 0) {
            fprintf(stderr, "Failed to map %zu bytes of host memory: %s\n", b->size, nvm_strerror(rc));
            free(b->va);
            b->va = NULL;
        }
        return rc;
    }
    /* Module-free: lock the pages so that their physical addresses stay put. */
    if (mlock(b->va, b->size) != 0) {
        rc = errno;
        fprintf(stderr, "Failed to lock %zu bytes: %s\n", b->size, strerror(rc));
        free(b->va);
        b->va = NULL;
        return rc;
    }
    addrs = calloc(pages, sizeof(uint64_t));
    if (addrs == NULL) {
        rc = ENOMEM;
        goto fail;
    }
    for (i = 0; i < pages; ++i) {
        addrs[i] = phys_of(t, (char*) b->va + i * t->ps);
        if (addrs[i] == 0) {
            free(addrs);
            fprintf(stderr, "No physical address for a locked page in /proc/self/pagemap (needs root)\n");
            rc = EPERM;
            goto fail;
        }
    }
    rc = nvm_dma_map(&b->win, t->ctrl, b->va, t->ps, pages, addrs);
    free(addrs);
    if (rc != 0) {
        fprintf(stderr, "Failed to create DMA window: %s\n", nvm_strerror(rc));
        goto fail;
    }
    return 0;
fail:
    munlock(b->va, b->size);
    free(b->va);
    b->va = NULL;
    return rc;
}

void tool_buf_free(struct tool_buf* b)
{
    if (b->win != NULL) {
        nvm_dma_unmap(b->win);
        b->win = NULL;
    }
    if (b->va != NULL) {
        munlock(b->va, b->size);
        free(b->va);
        b->va = NULL;
    }
}

int tool_admin(struct tool_ctrl* t)
{
    struct tool_buf b;
    int rc = tool_buf_new(t, &b, 3 * t->ps);
    if (rc != 0) {
        return rc;
    }
    t->adm_va = b.va;
    t->adm = b.win;
    rc = nvm_aq_create(&t->aq, t->ctrl, t->adm);
    if (rc != 0) {
        t->aq = NULL;
        fprintf(stderr, "Failed to reset controller and create admin queues: %s\n", nvm_strerror(rc));
    }
    return rc;
}

int tool_ctrl_info(struct tool_ctrl* t, struct nvm_ctrl_info* info)
{
    int rc = nvm_admin_ctrl_info(t->aq, info, NVM_DMA_OFFSET(t->adm, 2), t->adm->ioaddrs[2]);
    if (rc != 0) {
        fprintf(stderr, "Failed to identify controller: %s\n", nvm_strerror(rc));
    }
    return rc;
}

int tool_ns_info(struct tool_ctrl* t, uint32_t ns_id, struct nvm_ns_info* ns)
{
    int rc = nvm_admin_ns_info(t->aq, ns, ns_id, NVM_DMA_OFFSET(t->adm, 2), t->adm->ioaddrs[2]);
    if (rc != 0) {
        fprintf(stderr, "Failed to identify namespace %u: %s\n", ns_id, nvm_strerror(rc));
    }
    return rc;
}

int tool_qp_create(struct tool_ctrl* t, struct tool_qp* qp, uint16_t id, int prp_lists)
{
    size_t sq_entries = t->ps / sizeof(nvm_cmd_t);
    int rc;

    memset(qp, 0, sizeof(*qp));
    if (sq_entries > t->ctrl->max_entries) {
        sq_entries = t->ctrl->max_entries;
    }
    qp->prp_lists = prp_lists;
    rc = tool_buf_new(t, &qp->mem, (2 + (prp_lists ? sq_entries : 0)) * t->ps);
    if (rc != 0) {
        return rc;
    }
    rc = nvm_admin_cq_create(t->aq, &qp->cq, id, NVM_DMA_OFFSET(qp->mem.win, 0), qp->mem.win->ioaddrs[0]);
    if (rc != 0) {
        fprintf(stderr, "Failed to create completion queue %u: %s\n", id, nvm_strerror(rc));
        tool_buf_free(&qp->mem);
        return rc;
    }
    rc = nvm_admin_sq_create(t->aq, &qp->sq, &qp->cq, id, NVM_DMA_OFFSET(qp->mem.win, 1), qp->mem.win->ioaddrs[1]);
    if (rc != 0) {
        fprintf(stderr, "Failed to create submission queue %u: %s\n", id, nvm_strerror(rc));
        nvm_admin_cq_delete(t->aq, &qp->cq);
        tool_buf_free(&qp->mem);
        return rc;
    }
    return 0;
}

int tool_qp_delete(struct tool_ctrl* t, struct tool_qp* qp)
{
    int rc = 0, r;
    if (qp->sq.db != NULL) {
        r = nvm_admin_sq_delete(t->aq, &qp->sq, &qp->cq);
        if (r != 0) {
            fprintf(stderr, "Failed to delete submission queue %u: %s\n", qp->sq.no, nvm_strerror(r));
            rc = r;
        }
    }
    if (qp->cq.db != NULL) {
        r = nvm_admin_cq_delete(t->aq, &qp->cq);
        if (r != 0) {
            fprintf(stderr, "Failed to delete completion queue %u: %s\n", qp->cq.no, nvm_strerror(r));
            rc = rc ? rc : r;
        }
    }
    tool_buf_free(&qp->mem);
    return rc;
}

void tool_close(struct tool_ctrl* t)
{
    if (t->aq != NULL) {
        nvm_aq_destroy(t->aq);
        t->aq = NULL;
    }
    if (t->adm != NULL) {
        struct tool_buf b = { t->adm_va, 3 * t->ps, t->adm };
        tool_buf_free(&b);
        t->adm = NULL;
        t->adm_va = NULL;
    }
    if (t->ctrl != NULL) {
        nvm_ctrl_free(t->ctrl);
        t->ctrl = NULL;
    }
    if (t->bar != NULL) {
        munmap((void*) t->bar, t->bar_size);
        t->bar = NULL;
    }
    if (t->pagemap >= 0) {
        close(t->pagemap);
        t->pagemap = -1;
    }
}

void tool_print_ctrl_info(const struct nvm_ctrl_info* info, uint16_t n_cqs, uint16_t n_sqs)
{
    printf("------------- Controller information -------------\n");
    printf("PCI Vendor ID           : %02x %02x\n", info->pci_vendor[0], info->pci_vendor[1]);
    printf("PCI Subsystem Vendor ID : %02x %02x\n", info->pci_vendor[2], info->pci_vendor[3]);
    printf("NVM Express version     : %u.%u.%u\n", info->nvme_version >> 16, (info->nvme_version >> 8) & 0xff,
           info->nvme_version & 0xff);
    printf("Controller page size    : %zu\n", info->page_size);
    printf("Max queue entries       : %u\n", info->max_entries);
    printf("Serial Number           : %.20s\n", info->serial_no);
    printf("Model Number            : %.40s\n", info->model_no);
    printf("Firmware revision       : %.8s\n", info->firmware);
    printf("Max data transfer size  : %zu\n", info->max_data_size);
    printf("Max outstanding commands: %zu\n", info->max_out_cmds);
    printf("Max number of namespaces: %zu\n", info->max_n_ns);
    printf("Current number of CQs   : %u\n", n_cqs);
    printf("Current number of SQs   : %u\n", n_sqs);
    printf("--------------------------------------------------\n");
}

void tool_print_ns_info(const struct nvm_ns_info* ns)
{
    printf("------------- Namespace  information -------------\n");
    printf("Namespace identifier    : %x\n", ns->ns_id);
    printf("Logical block size      : %zu bytes\n", ns->lba_data_size);
    printf("Namespace size          : %llu blocks\n", (unsigned long long) ns->size);
    printf("Namespace capacity      : %llu blocks\n", (unsigned long long) ns->capacity);
    printf("--------------------------------------------------\n");
}
