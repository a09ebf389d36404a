/*
 * libnvm against QEMU's emulated NVMe controller, module-free (as nvm-identify-userspace runs):
 * BAR0 through sysfs resource0, host memory located through /proc/self/pagemap (no IOMMU in the
 * VM, so bus address = physical address). Usage: vm_libnvm BDF WRITES_FILE
 *
 * Checks, each asserting data: bring-up (CAP/VS), identify controller and namespace, more than
 * 63 admin commands on one reference, I/O queue create/delete and their error statuses, reads
 * with PRP1 (with an offset), PRP1+PRP2, PRP lists and MDTS-sized transfers checked against the
 * image pattern (tests/vm/nvme/image.py), queue wrap many times at depth, writes (recorded in
 * WRITES_FILE as "offset length seed") read back, and the error table QEMU can produce. Prints
 * "ok - ..." / "not ok - ..." lines and exits 0 only when everything holds.
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
#include <unistd.h>

#define PATTERN_TAG (0xA5ULL << 56)
#define WRITE_MUL 0x9E3779B97F4A7C15ULL

static int failures;
static FILE* writes;

#define OK(cond, ...) do { \
    if (cond) { printf("ok - "); } else { printf("not ok - "); ++failures; } \
    printf(__VA_ARGS__); printf("\n"); fflush(stdout); \
} while (0)

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

static nvm_queue_t cq, sq;
static struct buf qmem;    /* page 0: CQ, page 1: SQ, pages 2..: one PRP list page per SQ slot */

/* Enqueues one read/write of nblks blocks at lba into data pages [first, first+n). */
static nvm_cmd_t* enqueue(uint8_t op, uint64_t lba, uint16_t nblks, const struct buf* d, size_t first, size_t n,
                          size_t prp_offset)
{
    nvm_cmd_t* cmd = nvm_sq_enqueue(&sq);
    size_t slot;
    uint64_t io[160];
    size_t i;
    if (cmd == NULL) {
        return NULL;
    }
    slot = (size_t) (cmd - (nvm_cmd_t*) sq.vaddr);
    for (i = 0; i < n; ++i) {
        io[i] = d->win->ioaddrs[first + i];
    }
    io[0] += prp_offset;
    nvm_cmd_header(cmd, NVM_DEFAULT_CID(&sq), op, 1);
    nvm_cmd_data(cmd, ps, n, NVM_DMA_OFFSET(qmem.win, 2 + slot), qmem.win->ioaddrs[2 + slot], io);
    nvm_cmd_rw_blks(cmd, lba, nblks);
    return cmd;
}

static int wait_one(uint16_t* cid)
{
    nvm_cpl_t* cpl = nvm_cq_dequeue_block(&cq, 10000);
    int st;
    if (cpl == NULL) {
        return ETIME;
    }
    if (cid) {
        *cid = *NVM_CPL_CID(cpl);
    }
    st = NVM_ERR_STATUS(cpl);
    nvm_sq_update(&sq);
    nvm_cq_update(&cq);
    return st;
}

static int io1(uint8_t op, uint64_t lba, uint16_t nblks, const struct buf* d, size_t first, size_t n, size_t off)
{
    if (enqueue(op, lba, nblks, d, first, n, off) == NULL) {
        return EAGAIN;
    }
    nvm_sq_submit(&sq);
    return wait_one(NULL);
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

    /* I/O queues: CQ page, SQ page, one PRP list page per SQ slot (64). */
    rc = buf_new(&qmem, ctrl, 2 + 64);
    OK(rc == 0, "queue memory");
    rc = nvm_admin_cq_create(aq, &cq, 1, NVM_DMA_OFFSET(qmem.win, 0), qmem.win->ioaddrs[0]);
    OK(rc == 0 && cq.max_entries == 256, "create CQ 1 (%u entries): %s", cq.max_entries, nvm_strerror(rc));
    {
        nvm_queue_t dup;
        rc = nvm_admin_cq_create(aq, &dup, 1, NVM_DMA_OFFSET(qmem.win, 0), qmem.win->ioaddrs[0]);
        OK(rc == -0x101, "create CQ 1 again: %d (%s)", rc, nvm_strerror(rc));
        dup = cq;
        dup.no = 9;
        rc = nvm_admin_sq_create(aq, &sq, &dup, 1, NVM_DMA_OFFSET(qmem.win, 1), qmem.win->ioaddrs[1]);
        OK(rc == -0x100, "create SQ on a missing CQ: %d (%s)", rc, nvm_strerror(rc));
    }
    rc = nvm_admin_sq_create(aq, &sq, &cq, 1, NVM_DMA_OFFSET(qmem.win, 1), qmem.win->ioaddrs[1]);
    OK(rc == 0 && sq.max_entries == 64, "create SQ 1 (%u entries): %s", sq.max_entries, nvm_strerror(rc));
    rc = nvm_admin_cq_delete(aq, &cq);
    OK(rc == -0x10c && cq.db != NULL, "delete CQ with an SQ attached: %d (%s)", rc, nvm_strerror(rc));

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
        nvm_sq_submit(&sq);
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
            nvm_sq_submit(&sq);
            {
                nvm_cpl_t* cpl = nvm_cq_dequeue_block(&cq, 10000);
                uint16_t cid;
                if (cpl == NULL) {
                    bad = 1;
                    break;
                }
                cid = *NVM_CPL_CID(cpl);
                if (!NVM_ERR_OK(cpl)) {
                    bad = 2;
                }
                nvm_sq_update(&sq);
                nvm_cq_update(&cq);
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

    rc = nvm_admin_sq_delete(aq, &sq, &cq);
    OK(rc == 0 && sq.db == NULL, "delete SQ 1: %s", nvm_strerror(rc));
    rc = nvm_admin_cq_delete(aq, &cq);
    OK(rc == 0 && cq.db == NULL, "delete CQ 1: %s", nvm_strerror(rc));
    rc = nvm_admin_cq_delete(aq, &cq);
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
    printf("# %d failures\n", failures);
    return failures ? 1 : 0;
}
