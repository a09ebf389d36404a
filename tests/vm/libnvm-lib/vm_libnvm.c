/*
 * libnvm against QEMU's emulated NVMe controller, module-free (as nvm-identify-userspace runs):
 * BAR0 through sysfs resource0, host memory located through /proc/self/pagemap (the VM's IOMMU
 * gives the controller an identity domain, so bus address = physical address).
 * Usage: vm_libnvm BDF WRITES_FILE
 *
 * Checks, each asserting data: bring-up (CAP/VS), identify controller and namespace, more than
 * 63 admin commands on one reference, I/O queue create/delete and their error statuses, reads
 * with PRP1 (with an offset), PRP1+PRP2, PRP lists and MDTS-sized transfers checked against the
 * image pattern (tests/vm/nvme/image.py), queue wrap many times at depth, writes (recorded in
 * WRITES_FILE as "offset length seed") read back, the error table QEMU can produce (I/O errors
 * in one batch, each on its own CID; admin errors; each with its nvm_strerror text), stalls
 * that must give ETIME and recover, and the controller memory buffer (BAR2 through sysfs
 * resource2, enabled through CMBMSC): an SQ, PRP lists and data in it. Prints "ok - ..." /
 * "not ok - ..." lines and exits 0 only when everything holds.
 */
#include <nvm_types.h>
#include <nvm_ctrl.h>
#include <nvm_dma.h>
#include <nvm_aq.h>
#include <nvm_admin.h>
#include <nvm_rpc.h>
#include <nvm_cmd.h>
#include <nvm_queue.h>
#include <nvm_util.h>
#include <nvm_error.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define PATTERN_TAG (0xA5ULL << 56)
#define WRITE_MUL 0x9E3779B97F4A7C15ULL

#include "../lib/check.h"

static FILE* writes;

#define OK(cond, ...) check_report(!!(cond), __VA_ARGS__)

static size_t ps;
static int pagemap = -1;

/* Physical address of a locked page of this process. */
static uint64_t phys(const void* va)
{
    uint64_t entry = 0;
    off_t off = (off_t) ((uintptr_t) va / ps) * 8;
    if (pread(pagemap, &entry, 8, off) != 8 || !(entry >> 63)) {
        return 0;
    }
    return (entry & ((1ULL << 55) - 1)) * ps + ((uintptr_t) va % ps);
}

/* Pinned host memory with a DMA window of physical addresses. */
struct buf {
    void* va;
    size_t pages;
    nvm_dma_t* win;
};

static int buf_new(struct buf* b, const nvm_ctrl_t* ctrl, size_t pages)
{
    uint64_t* addrs;
    size_t i;
    int rc;
    b->pages = pages;
    if (posix_memalign(&b->va, ps, pages * ps) != 0) {
        return ENOMEM;
    }
    memset(b->va, 0, pages * ps);
    if (mlock(b->va, pages * ps) != 0) {
        return errno;
    }
    addrs = (uint64_t*) calloc(pages, 8);
    for (i = 0; i < pages; ++i) {
        addrs[i] = phys((char*) b->va + i * ps);
        if (addrs[i] == 0) {
            free(addrs);
            return EFAULT;
        }
    }
    rc = nvm_dma_map(&b->win, ctrl, b->va, ps, pages, addrs);
    free(addrs);
    return rc;
}

static void buf_free(struct buf* b)
{
    nvm_dma_unmap(b->win);
    munlock(b->va, b->pages * ps);
    free(b->va);
}

static uint64_t expect_word(uint64_t off, uint64_t seed, int written)
{
    return written ? WRITE_MUL * seed + off : (PATTERN_TAG | off);
}

/* Compares len bytes (multiple of 8) read from disk offset off against the image. */
static int check(const void* data, size_t len, uint64_t off, uint64_t seed, int written)
{
    const uint64_t* w = (const uint64_t*) data;
    size_t i;
    for (i = 0; i < len / 8; ++i) {
        if (w[i] != expect_word(off + 8 * i, seed, written)) {
            printf("# word at disk byte %llu is %016llx, expected %016llx\n", (unsigned long long) (off + 8 * i),
                   (unsigned long long) w[i], (unsigned long long) expect_word(off + 8 * i, seed, written));
            return 0;
        }
    }
    return 1;
}

/* An I/O queue pair with one PRP list page per SQ slot. */
struct qp {
    nvm_queue_t cq, sq;
    const nvm_dma_t* lists; /* list page of SQ slot s: controller page list0 + s */
    size_t list0;
};

static struct qp q1;       /* queue pair 1: all in host memory */
static struct buf qmem;    /* page 0: CQ 1, page 1: SQ 1, pages 2..65: PRP lists of SQ 1, 66: CQ 2 */

/* Enqueues one read/write of nblks blocks at lba into data pages [first, first+n) of window d. */
static nvm_cmd_t* enqueue_on(struct qp* q, uint8_t op, uint64_t lba, uint16_t nblks, const nvm_dma_t* d, size_t first,
                             size_t n, size_t prp_offset)
{
    nvm_cmd_t* cmd = nvm_sq_enqueue(&q->sq);
    size_t slot;
    uint64_t io[160];
    size_t i;
    if (cmd == NULL) {
        return NULL;
    }
    slot = (size_t) (cmd - (nvm_cmd_t*) q->sq.vaddr);
    for (i = 0; i < n; ++i) {
        io[i] = d->ioaddrs[first + i];
    }
    io[0] += prp_offset;
    nvm_cmd_header(cmd, NVM_DEFAULT_CID(&q->sq), op, 1);
    nvm_cmd_data(cmd, ps, n, NVM_DMA_OFFSET(q->lists, q->list0 + slot), q->lists->ioaddrs[q->list0 + slot], io);
    nvm_cmd_rw_blks(cmd, lba, nblks);
    return cmd;
}

static nvm_cmd_t* enqueue(uint8_t op, uint64_t lba, uint16_t nblks, const struct buf* d, size_t first, size_t n,
                          size_t prp_offset)
{
    return enqueue_on(&q1, op, lba, nblks, d->win, first, n, prp_offset);
}

static int wait_on(struct qp* q, uint16_t* cid, uint64_t timeout_ms)
{
    nvm_cpl_t* cpl = nvm_cq_dequeue_block(&q->cq, timeout_ms);
    int st;
    if (cpl == NULL) {
        return ETIME;
    }
    if (cid) {
        *cid = *NVM_CPL_CID(cpl);
    }
    st = NVM_ERR_STATUS(cpl);
    nvm_sq_update(&q->sq);
    nvm_cq_update(&q->cq);
    return st;
}

static int wait_one(uint16_t* cid)
{
    return wait_on(&q1, cid, 10000);
}

static int io_on(struct qp* q, uint8_t op, uint64_t lba, uint16_t nblks, const nvm_dma_t* d, size_t first, size_t n,
                 size_t off)
{
    if (enqueue_on(q, op, lba, nblks, d, first, n, off) == NULL) {
        return EAGAIN;
    }
    nvm_sq_submit(&q->sq);
    return wait_on(q, NULL, 10000);
}

static int io1(uint8_t op, uint64_t lba, uint16_t nblks, const struct buf* d, size_t first, size_t n, size_t off)
{
    return io_on(&q1, op, lba, nblks, d->win, first, n, off);
}

/* --------------------------------------------------------------------------------------------
 * The error table (../shared/spec/libnvm.md §A7, §B8, §B9): every status QEMU 7.2 can be made to
 * produce, each checked as the packed value on exactly the command that caused it and as the
 * text nvm_strerror gives for it.
 */
static nvm_aq_ref g_aq;
static uint64_t g_nsze;
static size_t g_mdts_pages;

struct want {
    int status;
    const char* text;
};

static int status_is(int got, struct want w, const char* what)
{
    const char* t = nvm_strerror(got);
    int ok = got == w.status && strcmp(t, w.text) == 0;
    OK(ok, "%s: %d (-0x%x) \"%s\"", what, got, got < 0 ? -got : got, t);
    if (!ok) {
        printf("#   expected %d (-0x%x) \"%s\"\n", w.status, -w.status, w.text);
    }
    return ok;
}

/* Admin commands through nvm_raw_rpc: each returns its own packed status. */
static void admin_errors(uint64_t scratch)
{
    static const struct {
        const char* what;
        uint8_t opc;
        uint32_t nsid, cdw10, cdw11;
        int prp;
        struct want w;
    } t[] = {
        { "admin: unknown opcode 0x3f", 0x3f, 0, 0, 0, 0, { -0x01, "Invalid command opcode" } },
        { "admin: Create I/O CQ 3 of 1 entry (QSIZE 0)", NVM_ADMIN_CREATE_COMPLETION_QUEUE, 0, 3, 1, 1,
          { -0x102, "Invalid queue size" } },
        { "admin: Create I/O CQ 3 of 4096 entries (> MQES)", NVM_ADMIN_CREATE_COMPLETION_QUEUE, 0,
          (4095u << 16) | 3, 1, 1, { -0x102, "Invalid queue size" } },
        { "admin: Create I/O CQ 3 with interrupt vector 100", NVM_ADMIN_CREATE_COMPLETION_QUEUE, 0,
          (15u << 16) | 3, (100u << 16) | 3, 1, { -0x108, "Invalid interrupt vector" } },
        { "admin: Create I/O CQ 3 not physically contiguous (CAP.CQR 1)", NVM_ADMIN_CREATE_COMPLETION_QUEUE, 0,
          (15u << 16) | 3, 0, 1, { -0x02, "Invalid field in command" } },
        { "admin: Create I/O CQ 100 (> 64 queues)", NVM_ADMIN_CREATE_COMPLETION_QUEUE, 0, (15u << 16) | 100, 1, 1,
          { -0x101, "Invalid queue identifier" } },
        { "admin: Create I/O SQ 3 on missing CQ 9", NVM_ADMIN_CREATE_SUBMISSION_QUEUE, 0, (15u << 16) | 3,
          (9u << 16) | 1, 1, { -0x100, "Completion queue invalid" } },
        { "admin: Delete I/O SQ 7 (never created)", NVM_ADMIN_DELETE_SUBMISSION_QUEUE, 0, 7, 0, 0,
          { -0x101, "Invalid queue identifier" } },
        { "admin: Delete I/O CQ 1 with SQ 1 attached (QEMU: without DNR)", NVM_ADMIN_DELETE_COMPLETION_QUEUE, 0, 1, 0, 0,
          { -0x10c, "Invalid queue deletion" } },
        { "admin: Set Features Number of Queues after queues exist", NVM_ADMIN_SET_FEATURES, 0, 0x07, 0, 0,
          { -0x0c, "Command sequence error" } },
        { "admin: Set Features Arbitration with Save", NVM_ADMIN_SET_FEATURES, 0, (1u << 31) | 0x01, 0, 0,
          { -0x10d, "Feature identifier not saveable" } },
        { "admin: Get Features of reserved FID 0x00", NVM_ADMIN_GET_FEATURES, 0, 0x00, 0, 0,
          { -0x02, "Invalid field in command" } },
        { "admin: Get Log Page of unknown LID 0x7f (QEMU: SC 0x02, not 0x109)", NVM_ADMIN_GET_LOG_PAGE, 0xffffffff,
          (127u << 16) | 0x7f, 0, 1, { -0x02, "Invalid field in command" } },
        { "admin: Identify of unknown CNS 0x7f", NVM_ADMIN_IDENTIFY, 0, 0x7f, 0, 1,
          { -0x02, "Invalid field in command" } },
    };
    size_t i;
    for (i = 0; i < sizeof(t) / sizeof(t[0]); ++i) {
        nvm_cmd_t cmd;
        nvm_cpl_t cpl;
        memset(&cmd, 0, sizeof(cmd));
        memset(&cpl, 0, sizeof(cpl));
        nvm_cmd_header(&cmd, 0x1234, t[i].opc, t[i].nsid);
        if (t[i].prp) {
            nvm_cmd_data_ptr(&cmd, scratch, 0);
        }
        cmd.dword[10] = t[i].cdw10;
        cmd.dword[11] = t[i].cdw11;
        int rc = nvm_raw_rpc(g_aq, &cmd, &cpl);
        if (status_is(rc, t[i].w, t[i].what)) {
            /* the completion handed back is that command's: its CID restored, DNR as QEMU sets
             * it (on every refusal but the queue deletion one, which may succeed later) */
            unsigned dnr = t[i].opc != NVM_ADMIN_DELETE_COMPLETION_QUEUE;
            OK(*NVM_CPL_CID(&cpl) == 0x1234 && NVM_ERR_DNR(&cpl) == dnr && NVM_ERR_STATUS(&cpl) == rc,
               "  its completion: CID 0x%x, DNR %u", *NVM_CPL_CID(&cpl), NVM_ERR_DNR(&cpl));
        }
    }
    {
        /* Abort of a command that is not outstanding: success, DW0 bit 0 = 1 (not aborted). */
        nvm_cmd_t cmd;
        nvm_cpl_t cpl;
        memset(&cmd, 0, sizeof(cmd));
        nvm_cmd_header(&cmd, 0, NVM_ADMIN_ABORT, 0);
        cmd.dword[10] = (0x77u << 16) | 1;
        int rc = nvm_raw_rpc(g_aq, &cmd, &cpl);
        OK(rc == 0 && (cpl.dword[0] & 1) == 1, "admin: Abort of an idle CID: %d, DW0 0x%x (not aborted)", rc,
           cpl.dword[0]);
    }
}

/*
 * I/O commands, all queued at once behind one doorbell, good ones between bad ones: each
 * completion, found by its CID, must carry exactly its command's status, and the good reads
 * their data.
 */
static void io_errors(const struct buf* data)
{
    enum { OKRD, BADOP, MDTS1, PASTEND, NSID0, NSID2, NSIDBIG, PRP2OFF, LISTOFF, CMPOK, CMPBAD, OKRD2, N };
    static const char* what[N] = { "read 4 KiB at LBA 10",
                                   "unknown I/O opcode 0x7e",
                                   "read MDTS + 1 page",
                                   "read past the end",
                                   "read from NSID 0",
                                   "read from inactive NSID 2 (QEMU: SC 0x02, not 0x0b)",
                                   "read from NSID 0x1000 (> NN)",
                                   "read 8 KiB, PRP2 with an offset",
                                   "read 12 KiB, PRP list entry with an offset",
                                   "compare 4 KiB at LBA 40 with its pattern",
                                   "compare 4 KiB at LBA 48 with zeros",
                                   "read 8 KiB at LBA 77" };
    static const struct want want[N] = {
        { 0, "Success" },
        { -0x01, "Invalid command opcode" },
        { -0x02, "Invalid field in command" },
        { -0x80, "LBA out of range" },
        { -0x0b, "Invalid namespace or format" },
        { -0x02, "Invalid field in command" },
        { -0x0b, "Invalid namespace or format" },
        { -0x13, "PRP offset invalid" },
        { -0x13, "PRP offset invalid" },
        { 0, "Success" },
        { -0x285, "Compare failure" },
        { 0, "Success" },
    };
    uint16_t cid_of[N];
    int seen[N];
    int i, n;
    uint64_t* w;
    size_t k;

    memset(data->va, 0, data->pages * ps);
    /* page 20: LBA 40's pattern for the matching compare; page 21 stays zero */
    w = (uint64_t*) ((char*) data->va + 20 * ps);
    for (k = 0; k < ps / 8; ++k) {
        w[k] = PATTERN_TAG | (40 * 512 + 8 * k);
    }
    for (i = 0; i < N; ++i) {
        nvm_cmd_t* c = NULL;
        switch (i) {
        case OKRD: c = enqueue(NVM_IO_READ, 10, 8, data, 0, 1, 0); break;
        case BADOP:
            c = enqueue(NVM_IO_READ, 0, 8, data, 1, 1, 0);
            c->dword[0] = (c->dword[0] & 0xffff0000u) | 0x7e;
            break;
        case MDTS1: c = enqueue(NVM_IO_READ, 0, (uint16_t) ((g_mdts_pages + 1) * ps / 512), data, 0, g_mdts_pages + 1, 0); break;
        case PASTEND: c = enqueue(NVM_IO_READ, g_nsze - 4, 8, data, 2, 1, 0); break;
        case NSID0: c = enqueue(NVM_IO_READ, 0, 8, data, 3, 1, 0); c->dword[1] = 0; break;
        case NSID2: c = enqueue(NVM_IO_READ, 0, 8, data, 4, 1, 0); c->dword[1] = 2; break;
        case NSIDBIG: c = enqueue(NVM_IO_READ, 0, 8, data, 5, 1, 0); c->dword[1] = 0x1000; break;
        case PRP2OFF: c = enqueue(NVM_IO_READ, 0, 16, data, 6, 2, 0); c->dword[8] += 0x200; break;
        case LISTOFF: {
            c = enqueue(NVM_IO_READ, 0, 24, data, 8, 3, 0);
            /* the slot's list page (qmem page 2 + slot) holds data pages 9 and 10 */
            size_t slot = (size_t) (c - (nvm_cmd_t*) q1.sq.vaddr);
            ((uint64_t*) ((char*) qmem.va + (2 + slot) * ps))[1] += 0x100;
            break;
        }
        case CMPOK: c = enqueue(0x05, 40, 8, data, 20, 1, 0); break;
        case CMPBAD: c = enqueue(0x05, 48, 8, data, 21, 1, 0); break;
        case OKRD2: c = enqueue(NVM_IO_READ, 77, 16, data, 22, 2, 0); break;
        }
        if (c == NULL) {
            OK(0, "enqueue %s", what[i]);
            return;
        }
        cid_of[i] = *NVM_CMD_CID(c);
        seen[i] = 0;
    }
    nvm_sq_submit(&q1.sq);
    for (n = 0; n < N; ++n) {
        nvm_cpl_t* cpl = nvm_cq_dequeue_block(&q1.cq, 10000);
        if (cpl == NULL) {
            OK(0, "I/O error batch: completion %d of %d timed out", n + 1, N);
            return;
        }
        uint16_t cid = *NVM_CPL_CID(cpl);
        int st = NVM_ERR_STATUS(cpl);
        int dnr = NVM_ERR_DNR(cpl);
        nvm_sq_update(&q1.sq);
        nvm_cq_update(&q1.cq);
        for (i = 0; i < N && cid_of[i] != cid; ++i) {
        }
        if (i == N || seen[i]++) {
            OK(0, "completion for CID %u: no such command outstanding, or twice", cid);
            continue;
        }
        char label[160];
        snprintf(label, sizeof(label), "I/O batch, CID %u, %s", cid, what[i]);
        /* QEMU sets DNR on every refusal it makes before touching the media */
        if (status_is(st, want[i], label) && st != 0 && i != CMPBAD) {
            OK(dnr, "  with DNR");
        }
    }
    OK(check(data->va, ps, 10 * 512, 0, 0) && check((char*) data->va + 22 * ps, 2 * ps, 77 * 512, 0, 0),
       "I/O batch: the good reads' data, between the failures, verified");
    {
        const uint64_t* z = (const uint64_t*) ((char*) data->va + ps);
        int clean = 1;
        for (k = 0; k < 5 * ps / 8; ++k) {
            clean &= z[k] == 0;
        }
        OK(clean, "I/O batch: failed reads wrote nothing");
    }
}

/*
 * A stalled queue gives ETIME within its deadline, never a hang, and the queue recovers:
 * (1) a lost doorbell; (2) a completion queue the host stops releasing (no CQ head doorbell):
 * the controller fills it and then holds the next completion back.
 */
static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double) t.tv_sec + t.tv_nsec / 1e9;
}

static void stall_tests(const struct buf* data)
{
    double t0, dt;
    int rc;
    nvm_cpl_t* cpl;

    /* (1) lost doorbell */
    memset(data->va, 0, ps);
    if (enqueue(NVM_IO_READ, 300, 8, data, 0, 1, 0) == NULL) {
        OK(0, "stall: enqueue");
        return;
    }
    t0 = now_s();
    rc = wait_on(&q1, NULL, 300);
    dt = now_s() - t0;
    OK(rc == ETIME && dt >= 0.25 && dt < 5, "stall, doorbell not rung: ETIME after %.2f s (deadline 0.3 s)", dt);
    nvm_sq_submit(&q1.sq);
    rc = wait_one(NULL);
    OK(rc == 0 && check(data->va, ps, 300 * 512, 0, 0), "  recovered: doorbell rung, the read completes with its data");

    /* (2) the CQ head doorbell withheld: consume completions without releasing them */
    uint32_t cqsize = q1.cq.max_entries, held = 0, sent = 0, done = 0;
    while (held < cqsize - 1) {
        while (sent - done < 16 && sent < cqsize - 1) {
            if (enqueue(NVM_IO_READ, (uint64_t) (sent % 64) * 8, 8, data, 1 + sent % 16, 1, 0) == NULL) {
                break;
            }
            ++sent;
        }
        nvm_sq_submit(&q1.sq);
        cpl = nvm_cq_dequeue_block(&q1.cq, 10000);
        if (cpl == NULL || !NVM_ERR_OK(cpl)) {
            OK(0, "stall: filling the CQ, completion %u: %s", held, cpl ? "error" : "timeout");
            return;
        }
        nvm_sq_update(&q1.sq); /* SQ slots are reused; the CQ head stays where the controller saw it */
        ++done;
        ++held;
    }
    memset(data->va, 0, ps);
    if (enqueue(NVM_IO_READ, 500, 8, data, 0, 1, 0) == NULL) {
        OK(0, "stall: enqueue after filling");
        return;
    }
    nvm_sq_submit(&q1.sq);
    t0 = now_s();
    cpl = nvm_cq_dequeue_block(&q1.cq, 300);
    dt = now_s() - t0;
    OK(cpl == NULL && dt >= 0.25 && dt < 5,
       "stall, CQ full (%u completions not released): next completion held back, timeout after %.2f s", held, dt);
    nvm_cq_update(&q1.cq); /* release them all */
    rc = wait_on(&q1, NULL, 10000);
    OK(rc == 0 && check(data->va, ps, 500 * 512, 0, 0),
       "  recovered: CQ head doorbell written, the held completion arrives with its data");
}

/* --------------------------------------------------------------------------------------------
 * The controller memory buffer (QEMU: 1 MiB, BAR2; CMBSZ SQS, LISTS, RDS, WDS; no CQS): enabled
 * through CMBMSC at BAR2's bus address, mapped through sysfs resource2, handed to libnvm as
 * caller-supplied bus addresses (nvm_dma_map). SQ 2 lives in it, with CQ 2 in host memory; PRP
 * lists in it; data in it and in host memory; the queue wraps many times.
 */
static void cmb_tests(const char* bdf, volatile uint8_t* bar, const nvm_ctrl_t* ctrl, const struct buf* data)
{
    char path[256];
    unsigned long long start = 0, end = 0, flags = 0;
    FILE* f;
    int fd, i, rc;
    volatile uint8_t* cmb;
    nvm_dma_t* win = NULL;
    uint64_t* addrs;
    size_t npages, k;
    struct qp q2;
    enum { SQPG = 0, LIST0 = 1, DATA0 = 128 };

    snprintf(path, sizeof(path), "/sys/bus/pci/devices/%s/resource", bdf);
    f = fopen(path, "r");
    for (i = 0; f && i < 3; ++i) {
        if (fscanf(f, "%llx %llx %llx", &start, &end, &flags) != 3) {
            start = 0;
        }
    }
    if (f) {
        fclose(f);
    }
    OK(start && end - start + 1 == (1 << 20), "CMB: BAR2 at 0x%llx, %llu KiB", start, (end - start + 1) >> 10);
    if (!start) {
        return;
    }
    /* Enable: CBA = BAR2's bus address (no IOMMU translation here: bus = physical), CRE, CMSE. */
    *(volatile uint32_t*) (bar + 0x54) = (uint32_t) (start >> 32);
    *(volatile uint32_t*) (bar + 0x50) = (uint32_t) (start & ~0xfffULL) | 0x3;
    uint32_t cmbloc = *(volatile uint32_t*) (bar + 0x38), cmbsz = *(volatile uint32_t*) (bar + 0x3c);
    uint64_t szu = 4096ULL << (4 * ((cmbsz >> 8) & 0xf)), size = (uint64_t) (cmbsz >> 12) * szu;
    OK((cmbloc & 7) == 2 && (cmbloc >> 12) == 0 && size == (1 << 20) && (cmbsz & 0x1f) == 0x1d,
       "CMB: CMBLOC 0x%x (BIR 2), CMBSZ 0x%x (%llu KiB; SQS, LISTS, RDS, WDS; no CQS)", cmbloc, cmbsz,
       (unsigned long long) size >> 10);

    snprintf(path, sizeof(path), "/sys/bus/pci/devices/%s/resource2", bdf);
    fd = open(path, O_RDWR | O_SYNC);
    cmb = fd < 0 ? MAP_FAILED : mmap(NULL, 1 << 20, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    OK(cmb != MAP_FAILED, "CMB: resource2 mapped");
    if (cmb == MAP_FAILED) {
        return;
    }
    npages = (1 << 20) / ps;
    addrs = (uint64_t*) calloc(npages, 8);
    for (k = 0; k < npages; ++k) {
        addrs[k] = start + k * ps;
    }
    rc = nvm_dma_map(&win, ctrl, (void*) cmb, ps, npages, addrs);
    free(addrs);
    OK(rc == 0 && win->n_ioaddrs == npages, "CMB: nvm_dma_map of %zu pages at caller-supplied bus addresses: %s", npages,
       nvm_strerror(rc));
    if (rc != 0) {
        return;
    }
    for (k = 0; k < ps / 8; ++k) {
        ((volatile uint64_t*) cmb)[k] = 0x1111222233334444ULL;
    }
    OK(((volatile uint64_t*) cmb)[ps / 8 - 1] == 0x1111222233334444ULL, "CMB: host writes read back");

    memset((char*) qmem.va + 66 * ps, 0, ps);
    memset(&q2, 0, sizeof(q2));
    rc = nvm_admin_cq_create(g_aq, &q2.cq, 2, (char*) qmem.va + 66 * ps, qmem.win->ioaddrs[66]);
    OK(rc == 0, "CMB: CQ 2 in host memory: %s", nvm_strerror(rc));
    rc = nvm_admin_sq_create(g_aq, &q2.sq, &q2.cq, 2, (void*) (cmb + SQPG * ps), win->ioaddrs[SQPG]);
    OK(rc == 0 && q2.sq.max_entries == 64, "CMB: SQ 2 in the CMB (%u entries): %s", q2.sq.max_entries,
       nvm_strerror(rc));
    if (rc != 0) {
        nvm_dma_unmap(win);
        munmap((void*) cmb, 1 << 20);
        close(fd);
        return;
    }
    q2.lists = win;
    q2.list0 = LIST0;

    /* data in the CMB: PRP1, PRP1+PRP2, a PRP list in the CMB, MDTS */
    memset((void*) (cmb + DATA0 * ps), 0, g_mdts_pages * ps);
    rc = io_on(&q2, NVM_IO_READ, 7, 8, win, DATA0, 1, 0);
    OK(rc == 0 && check((const void*) (cmb + DATA0 * ps), ps, 7 * 512, 0, 0), "CMB: read 4 KiB into the CMB (PRP1): %s",
       nvm_strerror(rc));
    rc = io_on(&q2, NVM_IO_READ, 2000, 16, win, DATA0 + 1, 2, 0);
    OK(rc == 0 && check((const void*) (cmb + (DATA0 + 1) * ps), 2 * ps, 2000 * 512, 0, 0),
       "CMB: read 8 KiB into the CMB (PRP1+PRP2): %s", nvm_strerror(rc));
    rc = io_on(&q2, NVM_IO_READ, 4096, (uint16_t) (g_mdts_pages * ps / 512), win, DATA0, g_mdts_pages, 0);
    OK(rc == 0 && check((const void*) (cmb + DATA0 * ps), g_mdts_pages * ps, 4096 * 512, 0, 0),
       "CMB: read MDTS (%zu KiB) into the CMB, PRP list in the CMB: %s", g_mdts_pages * ps >> 10, nvm_strerror(rc));
    /* data in host memory, PRP list in the CMB */
    memset(data->va, 0, g_mdts_pages * ps);
    rc = io_on(&q2, NVM_IO_READ, 6000, (uint16_t) (g_mdts_pages * ps / 512), data->win, 0, g_mdts_pages, 0);
    OK(rc == 0 && check(data->va, g_mdts_pages * ps, 6000ULL * 512, 0, 0),
       "CMB: read MDTS into host memory through a PRP list in the CMB: %s", nvm_strerror(rc));
    /* one command's data in both: QEMU refuses (all data in the CMB or none) */
    {
        nvm_cmd_t* c = enqueue_on(&q2, NVM_IO_READ, 0, 16, win, DATA0, 2, 0);
        c->dword[8] = (uint32_t) data->win->ioaddrs[0];
        c->dword[9] = (uint32_t) (data->win->ioaddrs[0] >> 32);
        nvm_sq_submit(&q2.sq);
        rc = wait_on(&q2, NULL, 10000);
        status_is(rc, (struct want){ -0x12, "Invalid use of controller memory buffer" },
                  "CMB: one read into CMB (PRP1) and host memory (PRP2)");
    }
    /* a write from the CMB, recorded for the host's image check, read back into host memory */
    {
        uint64_t off = g_nsze * 512 - 64 * ps;
        uint64_t seed = 0x5eed + (uint64_t) getpid();
        for (k = 0; k < 4 * ps / 8; ++k) {
            ((volatile uint64_t*) (cmb + DATA0 * ps))[k] = WRITE_MUL * seed + off + 8 * k;
        }
        rc = io_on(&q2, NVM_IO_WRITE, off / 512, (uint16_t) (4 * ps / 512), win, DATA0, 4, 0);
        if (rc == 0) {
            fprintf(writes, "%llu %zu %llu\n", (unsigned long long) off, 4 * ps, (unsigned long long) seed);
            fflush(writes);
        }
        memset(data->va, 0, 4 * ps);
        int rc2 = io_on(&q2, NVM_IO_READ, off / 512, (uint16_t) (4 * ps / 512), data->win, 0, 4, 0);
        OK(rc == 0 && rc2 == 0 && check(data->va, 4 * ps, off, seed, 1),
           "CMB: write 16 KiB from the CMB (PRP list in the CMB), read back into host memory: %s / %s",
           nvm_strerror(rc), nvm_strerror(rc2));
    }
    /* wrap: 1000 reads at depth 16 through the CMB SQ, data alternating between CMB and host */
    {
        uint64_t lba_of[128];
        size_t page_of[128];
        size_t freep[16];
        int nfree = 16, sent = 0, done = 0, bad = 0;
        const int total = 1000;
        for (i = 0; i < 16; ++i) {
            freep[i] = (size_t) i;
        }
        while (done < total && !bad) {
            while (sent < total && nfree > 0) {
                /* below every region the storage suites write (27-libnvm-pq: from LBA 40960) */
                uint64_t lba = ((uint64_t) sent * 104729 * 8) % 39992;
                size_t page = freep[nfree - 1];
                nvm_cmd_t* c = page % 2 ? enqueue_on(&q2, NVM_IO_READ, lba, 8, win, DATA0 + page, 1, 0)
                                        : enqueue_on(&q2, NVM_IO_READ, lba, 8, data->win, page, 1, 0);
                if (c == NULL) {
                    break;
                }
                --nfree;
                lba_of[*NVM_CMD_CID(c) % 128] = lba;
                page_of[*NVM_CMD_CID(c) % 128] = page;
                ++sent;
            }
            nvm_sq_submit(&q2.sq);
            nvm_cpl_t* cpl = nvm_cq_dequeue_block(&q2.cq, 10000);
            if (cpl == NULL) {
                bad = 1;
                break;
            }
            uint16_t cid = *NVM_CPL_CID(cpl);
            if (!NVM_ERR_OK(cpl)) {
                bad = 2;
            }
            nvm_sq_update(&q2.sq);
            nvm_cq_update(&q2.cq);
            size_t page = page_of[cid % 128];
            const void* p = page % 2 ? (const void*) (cmb + (DATA0 + page) * ps) : (const void*) ((char*) data->va + page * ps);
            if (!check(p, ps, lba_of[cid % 128] * 512, 0, 0)) {
                bad = 3;
            }
            freep[nfree++] = page;
            ++done;
        }
        OK(!bad && done == total, "CMB: %d reads at depth 16 through SQ 2 in the CMB (wrapped %d times): %s", done,
           done / 64, bad == 1 ? "timeout" : bad == 2 ? "error status" : bad == 3 ? "wrong data" : "data verified");
    }
    rc = nvm_admin_sq_delete(g_aq, &q2.sq, &q2.cq);
    OK(rc == 0, "CMB: delete SQ 2: %s", nvm_strerror(rc));
    rc = nvm_admin_cq_delete(g_aq, &q2.cq);
    OK(rc == 0, "CMB: delete CQ 2: %s", nvm_strerror(rc));
    nvm_dma_unmap(win);
    munmap((void*) cmb, 1 << 20);
    close(fd);
}

int main(int argc, char** argv)
{
    char path[256];
    int fd;
    struct stat stt;
    volatile void* bar;
    nvm_ctrl_t* ctrl = NULL;
    nvm_aq_ref aq = NULL;
    struct buf adm, data;
    struct nvm_ctrl_info info;
    struct nvm_ns_info ns;
    uint16_t nc = 0, ns_ = 0;
    int rc, i;
    uint64_t disk;
    size_t max_pages;

    if (argc != 3) {
        fprintf(stderr, "usage: %s BDF WRITES_FILE\n", argv[0]);
        return 2;
    }
    ps = (size_t) sysconf(_SC_PAGESIZE);
    pagemap = open("/proc/self/pagemap", O_RDONLY);
    writes = fopen(argv[2], "a");
    snprintf(path, sizeof(path), "/sys/bus/pci/devices/%s/resource0", argv[1]);
    fd = open(path, O_RDWR | O_SYNC);
    if (fd < 0 || pagemap < 0 || writes == NULL || fstat(fd, &stt) != 0) {
        perror("open");
        return 1;
    }
    bar = mmap(NULL, (size_t) stt.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (bar == MAP_FAILED) {
        perror("mmap resource0");
        return 1;
    }
    rc = nvm_raw_ctrl_init(&ctrl, bar, (size_t) stt.st_size);
    OK(rc == 0, "nvm_raw_ctrl_init on resource0 (%lld bytes): %s", (long long) stt.st_size, nvm_strerror(rc));
    if (rc != 0) {
        return 1;
    }
    OK(ctrl->max_entries == 2048 && ctrl->timeout == 7500 && ctrl->dstrd == 0,
       "CAP: max_entries %u, timeout %llu ms, dstrd %u", ctrl->max_entries, (unsigned long long) ctrl->timeout, ctrl->dstrd);

    rc = buf_new(&adm, ctrl, 3);
    OK(rc == 0, "admin memory located through pagemap: %s", nvm_strerror(rc));
    rc = nvm_aq_create(&aq, ctrl, adm.win);
    OK(rc == 0, "nvm_aq_create (reset, CAP.TO honoured): %s", nvm_strerror(rc));
    if (rc != 0) {
        return 1;
    }
    OK(*(volatile uint32_t*) ((volatile char*) bar + 0x24) == 0x00ff003f, "AQA = 0x%08x (ACQS 255, ASQS 63)",
       *(volatile uint32_t*) ((volatile char*) bar + 0x24));

    rc = nvm_admin_ctrl_info(aq, &info, NVM_DMA_OFFSET(adm.win, 2), adm.win->ioaddrs[2]);
    OK(rc == 0 && info.nvme_version == 0x10400 && memcmp(info.model_no, "QEMU NVMe Ctrl", 14) == 0 &&
       memcmp(info.serial_no, "gpudirect-rs", 12) == 0 && info.pci_vendor[0] == 0x36 && info.pci_vendor[1] == 0x1b,
       "identify controller: %.40s / %.20s, version %x", info.model_no, info.serial_no, info.nvme_version);
    OK(info.max_data_size == 524288 && info.sq_entry_size == 64 && info.cq_entry_size == 16 && info.max_n_ns == 256,
       "identify decode: mdts %zu, sqes %zu, cqes %zu, nn %zu", info.max_data_size, info.sq_entry_size,
       info.cq_entry_size, info.max_n_ns);
    rc = nvm_admin_ns_info(aq, &ns, 1, NVM_DMA_OFFSET(adm.win, 2), adm.win->ioaddrs[2]);
    OK(rc == 0 && ns.lba_data_size == 512 && ns.size >= 2048, "identify namespace 1: %llu blocks of %zu",
       (unsigned long long) ns.size, ns.lba_data_size);
    disk = ns.size * ns.lba_data_size;
    g_aq = aq;
    g_nsze = ns.size;
    g_mdts_pages = info.max_data_size / ps;

    for (i = 0; i < 200; ++i) {
        rc = nvm_admin_get_num_queues(aq, &nc, &ns_);
        if (rc != 0) {
            break;
        }
    }
    OK(rc == 0 && i == 200 && nc == 64 && ns_ == 64, "200 admin commands on one reference (upstream stalls at 64): %d %u/%u",
       i, nc, ns_);
    nc = 1;
    ns_ = 1;
    rc = nvm_admin_request_num_queues(aq, &nc, &ns_);
    OK(rc == 0, "set number of queues: granted %u CQs, %u SQs", nc, ns_);

    /* I/O queues: CQ page, SQ page, one PRP list page per SQ slot (64), CQ 2's page. */
    rc = buf_new(&qmem, ctrl, 2 + 64 + 1);
    q1.lists = qmem.win;
    q1.list0 = 2;
    OK(rc == 0, "queue memory");
    rc = nvm_admin_cq_create(aq, &q1.cq, 1, NVM_DMA_OFFSET(qmem.win, 0), qmem.win->ioaddrs[0]);
    OK(rc == 0 && q1.cq.max_entries == 256, "create CQ 1 (%u entries): %s", q1.cq.max_entries, nvm_strerror(rc));
    {
        nvm_queue_t dup;
        rc = nvm_admin_cq_create(aq, &dup, 1, NVM_DMA_OFFSET(qmem.win, 0), qmem.win->ioaddrs[0]);
        OK(rc == -0x101, "create CQ 1 again: %d (%s)", rc, nvm_strerror(rc));
        dup = q1.cq;
        dup.no = 9;
        rc = nvm_admin_sq_create(aq, &q1.sq, &dup, 1, NVM_DMA_OFFSET(qmem.win, 1), qmem.win->ioaddrs[1]);
        OK(rc == -0x100, "create SQ on a missing CQ: %d (%s)", rc, nvm_strerror(rc));
    }
    rc = nvm_admin_sq_create(aq, &q1.sq, &q1.cq, 1, NVM_DMA_OFFSET(qmem.win, 1), qmem.win->ioaddrs[1]);
    OK(rc == 0 && q1.sq.max_entries == 64, "create SQ 1 (%u entries): %s", q1.sq.max_entries, nvm_strerror(rc));
    rc = nvm_admin_cq_delete(aq, &q1.cq);
    OK(rc == -0x10c && q1.cq.db != NULL, "delete CQ with an SQ attached: %d (%s)", rc, nvm_strerror(rc));

    max_pages = info.max_data_size / ps;
    rc = buf_new(&data, ctrl, max_pages + 1);
    OK(rc == 0, "data memory (%zu pages)", max_pages + 1);

    /* Reads of every PRP shape. */
    memset(data.va, 0, data.pages * ps);
    rc = io1(NVM_IO_READ, 5, 1, &data, 0, 1, 512);
    OK(rc == 0 && check((char*) data.va + 512, 512, 5 * 512, 0, 0) && ((uint64_t*) data.va)[0] == 0,
       "read 1 block, PRP1 with offset 512: %s", nvm_strerror(rc));
    rc = io1(NVM_IO_READ, 64, 16, &data, 0, 2, 0);
    OK(rc == 0 && check(data.va, 2 * ps, 64 * 512, 0, 0), "read 8 KiB, PRP1+PRP2: %s", nvm_strerror(rc));
    rc = io1(NVM_IO_READ, 1000, 72, &data, 0, 9, 0);
    OK(rc == 0 && check(data.va, 9 * ps, 1000 * 512, 0, 0), "read 36 KiB, PRP list: %s", nvm_strerror(rc));
    rc = io1(NVM_IO_READ, 2048, (uint16_t) (info.max_data_size / 512), &data, 0, max_pages, 0);
    OK(rc == 0 && check(data.va, info.max_data_size, 2048 * 512, 0, 0), "read MDTS (%zu bytes), PRP list: %s",
       info.max_data_size, nvm_strerror(rc));
    rc = io1(NVM_IO_READ, 0, (uint16_t) (info.max_data_size / 512 + 8), &data, 0, max_pages + 1, 0);
    OK(rc == -2, "read MDTS + 1 page: %d (%s)", rc, nvm_strerror(rc));
    rc = io1(NVM_IO_READ, ns.size - 1, 8, &data, 0, 1, 0);
    OK(rc == -0x80, "read past the end: %d (%s)", rc, nvm_strerror(rc));
    {
        nvm_cmd_t* c = enqueue(NVM_IO_READ, 0, 1, &data, 0, 1, 0);
        c->dword[0] = (c->dword[0] & 0xffff0000) | 0x7e;
        nvm_sq_submit(&q1.sq);
        rc = wait_one(NULL);
        OK(rc == -1, "unknown I/O opcode: %d (%s)", rc, nvm_strerror(rc));
    }

    /* Queue wrap at depth 16: 2000 verified 4 KiB reads through a 64-entry SQ. */
    {
        uint64_t lba_of[512];
        size_t page_of[512];
        size_t freep[16];
        int nfree = 16;
        int sent = 0, done = 0, bad = 0;
        const int total = 2000;
        for (i = 0; i < 16; ++i) {
            freep[i] = (size_t) i;
        }
        while (done < total && !bad) {
            while (sent < total && nfree > 0) {
                uint64_t lba = ((uint64_t) sent * 7919 * 8) % (ns.size - 8);
                size_t page = freep[nfree - 1];
                nvm_cmd_t* c = enqueue(NVM_IO_READ, lba, 8, &data, page, 1, 0);
                if (c == NULL) {
                    break;
                }
                --nfree;
                lba_of[*NVM_CMD_CID(c) % 512] = lba;
                page_of[*NVM_CMD_CID(c) % 512] = page;
                ++sent;
            }
            nvm_sq_submit(&q1.sq);
            {
                nvm_cpl_t* cpl = nvm_cq_dequeue_block(&q1.cq, 10000);
                uint16_t cid;
                if (cpl == NULL) {
                    bad = 1;
                    break;
                }
                cid = *NVM_CPL_CID(cpl);
                if (!NVM_ERR_OK(cpl)) {
                    bad = 2;
                }
                nvm_sq_update(&q1.sq);
                nvm_cq_update(&q1.cq);
                /* completions may come out of order: the CID says which page and LBA */
                if (!check((char*) data.va + page_of[cid % 512] * ps, ps, lba_of[cid % 512] * 512, 0, 0)) {
                    bad = 3;
                }
                freep[nfree++] = page_of[cid % 512];
                ++done;
            }
        }
        OK(!bad && done == total, "%d reads at depth 16 (SQ wrapped %d times): %s", done, done / 64,
           bad == 1 ? "timeout" : bad == 2 ? "error status" : bad == 3 ? "wrong data" : "data verified");
    }

    /* Writes near the end of the disk, recorded for the host's image check, read back. */
    {
        uint64_t off = disk - 16 * ps;
        uint64_t seed = 0x1234 + (uint64_t) getpid();
        uint64_t* w = (uint64_t*) data.va;
        size_t k;
        for (k = 0; k < 8 * ps / 8; ++k) {
            w[k] = WRITE_MUL * seed + off + 8 * k;
        }
        rc = io1(NVM_IO_WRITE, off / 512, (uint16_t) (8 * ps / 512), &data, 0, 8, 0);
        if (rc == 0) {
            fprintf(writes, "%llu %zu %llu\n", (unsigned long long) off, 8 * ps, (unsigned long long) seed);
            fflush(writes);
        }
        OK(rc == 0, "write 32 KiB at %llu (PRP list): %s", (unsigned long long) off, nvm_strerror(rc));
        rc = io1(NVM_IO_FLUSH, 0, 1, &data, 0, 1, 0);
        OK(rc == 0, "flush: %s", nvm_strerror(rc));
        memset(data.va, 0, 8 * ps);
        rc = io1(NVM_IO_READ, off / 512, (uint16_t) (8 * ps / 512), &data, 0, 8, 0);
        OK(rc == 0 && check(data.va, 8 * ps, off, seed, 1), "read back the write: %s", nvm_strerror(rc));
        rc = io1(NVM_IO_READ, off / 512 - 8, 8, &data, 0, 1, 0);
        OK(rc == 0 && check(data.va, ps, off - ps, 0, 0), "the block before it is untouched");
    }

    io_errors(&data);
    admin_errors(adm.win->ioaddrs[2]);
    stall_tests(&data);
    cmb_tests(argv[1], (volatile uint8_t*) bar, ctrl, &data);

    rc = nvm_admin_sq_delete(aq, &q1.sq, &q1.cq);
    OK(rc == 0 && q1.sq.db == NULL, "delete SQ 1: %s", nvm_strerror(rc));
    rc = nvm_admin_cq_delete(aq, &q1.cq);
    OK(rc == 0 && q1.cq.db == NULL, "delete CQ 1: %s", nvm_strerror(rc));
    rc = nvm_admin_cq_delete(aq, &q1.cq);
    OK(rc == EINVAL, "delete CQ 1 again: %d", rc);

    nvm_aq_destroy(aq);
    /* Disable the controller before its queue memory goes back to the allocator. */
    *(volatile uint32_t*) ((volatile char*) bar + 0x14) &= ~1u;
    for (i = 0; i < 1000 && (*(volatile uint32_t*) ((volatile char*) bar + 0x1c) & 1); ++i) {
        usleep(1000);
    }
    buf_free(&data);
    buf_free(&qmem);
    buf_free(&adm);
    nvm_ctrl_free(ctrl);
    munmap((void*) bar, (size_t) stt.st_size);
    close(fd);
    fclose(writes);
    printf("# %d failures\n", check_failures);
    return check_failures ? 1 : 0;
}
