/*
 * A libnvm consumer in the shape of upstream's examples (identify, read-blocks), built only
 * against the installed nvm_*.h with `pkg-config --cflags --libs nvm`. It drives the software
 * controller of sim/nvmesim through its tiny C API: nvm_raw_ctrl_init on the simulator's BAR
 * region, and virtual addresses as bus addresses (the simulator's DMA is a memcpy).
 *
 * Checks: identify output, Number of Queues, I/O queue creation, reads with PRP1, PRP2 and PRP
 * lists verified against the simulator's pattern, a write read back, the error path
 * (LBA out of range, its nvm_strerror text), queue deletion, teardown. Exit 0 only if all hold.
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
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* sim/nvmesim's C API (libnvmesim.so). */
#ifdef __cplusplus
extern "C" {
#endif
void* nvmesim_start(uint64_t n_blocks);
volatile void* nvmesim_bar(void* sim);
size_t nvmesim_bar_size(void);
uint8_t nvmesim_pattern_byte(uint64_t offset);
int nvmesim_read_storage(void* sim, uint64_t offset, void* out, size_t len);
void nvmesim_stop(void* sim);
#ifdef __cplusplus
}
#endif

static int failures;

#define CHECK(cond, ...) do { \
    if (!(cond)) { \
        fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond); \
        fprintf(stderr, __VA_ARGS__); \
        fputc('\n', stderr); \
        ++failures; \
    } \
} while (0)

static void* page_alloc(size_t pages, size_t ps)
{
    void* p = NULL;
    if (posix_memalign(&p, ps, pages * ps) != 0) {
        return NULL;
    }
    memset(p, 0, pages * ps);
    return p;
}

/* nvm_dma_map over host memory, with virtual addresses as the simulator's bus addresses. */
static int map_virt(nvm_dma_t** win, const nvm_ctrl_t* ctrl, void* mem, size_t pages)
{
    uint64_t addrs[64];
    size_t i;
    for (i = 0; i < pages; ++i) {
        addrs[i] = (uint64_t) (uintptr_t) mem + i * ctrl->page_size;
    }
    return nvm_dma_map(win, ctrl, mem, ctrl->page_size, pages, addrs);
}

static void print_ctrl_info(const struct nvm_ctrl_info* info)
{
    printf("PCI Vendor ID           : %02x %02x\n", info->pci_vendor[0], info->pci_vendor[1]);
    printf("NVM Express version     : %u.%u.%u\n", info->nvme_version >> 16,
           (info->nvme_version >> 8) & 0xff, info->nvme_version & 0xff);
    printf("Controller page size    : %zu\n", info->page_size);
    printf("Max queue entries       : %u\n", info->max_entries);
    printf("Serial Number           : %.20s\n", info->serial_no);
    printf("Model Number            : %.40s\n", info->model_no);
    printf("Max data transfer size  : %zu\n", info->max_data_size);
}

/* One synchronous I/O: enqueue, submit, wait, update; returns the packed status. */
static int io(nvm_queue_t* sq, nvm_queue_t* cq, uint8_t op, uint64_t lba, uint16_t nblks,
              const nvm_dma_t* data, size_t first_page, size_t n_pages, void* list, uint64_t list_io)
{
    nvm_cmd_t* cmd = nvm_sq_enqueue(sq);
    nvm_cpl_t* cpl;
    uint16_t cid;
    int status;

    if (cmd == NULL) {
        return EAGAIN;
    }
    cid = NVM_DEFAULT_CID(sq);
    nvm_cmd_header(cmd, cid, op, 1);
    nvm_cmd_data(cmd, data->page_size, n_pages, list, list_io, &data->ioaddrs[first_page]);
    nvm_cmd_rw_blks(cmd, lba, nblks);
    nvm_sq_submit(sq);
    cpl = nvm_cq_dequeue_block(cq, 5000);
    if (cpl == NULL) {
        return ETIME;
    }
    CHECK(*NVM_CPL_CID(cpl) == cid, "completion CID %u, want %u", *NVM_CPL_CID(cpl), cid);
    CHECK(*NVM_CPL_SQID(cpl) == sq->no, "SQID %u", *NVM_CPL_SQID(cpl));
    status = NVM_ERR_STATUS(cpl);
    nvm_sq_update(sq);
    nvm_cq_update(cq);
    return status;
}

static void check_pattern(const unsigned char* buf, size_t len, uint64_t disk_off, const char* what)
{
    size_t i;
    for (i = 0; i < len; ++i) {
        if (buf[i] != nvmesim_pattern_byte(disk_off + i)) {
            CHECK(0, "%s: byte %zu is %02x, want %02x", what, i, buf[i], nvmesim_pattern_byte(disk_off + i));
            return;
        }
    }
}

int main(void)
{
    void* sim = nvmesim_start(16384);
    nvm_ctrl_t* ctrl = NULL;
    nvm_aq_ref aq = NULL;
    nvm_dma_t* aq_win = NULL;
    nvm_dma_t* q_win = NULL;
    nvm_dma_t* data_win = NULL;
    struct nvm_ctrl_info info;
    struct nvm_ns_info ns;
    nvm_queue_t cq, sq;
    uint16_t n_cqs = 0, n_sqs = 0;
    void* aq_mem;
    void* q_mem;
    unsigned char* data;
    size_t ps;
    int status;
    size_t n;

    if (sim == NULL) {
        fprintf(stderr, "nvmesim_start failed\n");
        return 2;
    }
    status = nvm_raw_ctrl_init(&ctrl, nvmesim_bar(sim), nvmesim_bar_size());
    if (status != 0) {
        fprintf(stderr, "nvm_raw_ctrl_init: %s\n", nvm_strerror(status));
        return 1;
    }
    ps = ctrl->page_size;
    CHECK(ps == 4096, "page size %zu", ps);
    CHECK(ctrl->max_entries == 2048, "max entries %u", ctrl->max_entries);

    /* identify: 3 pages, 2 for the admin queues, 1 for identify data */
    aq_mem = page_alloc(3, ps);
    status = map_virt(&aq_win, ctrl, aq_mem, 3);
    CHECK(status == 0, "nvm_dma_map: %s", nvm_strerror(status));
    fprintf(stderr, "Resetting controller and setting up admin queues...\n");
    status = nvm_aq_create(&aq, ctrl, aq_win);
    CHECK(status == 0, "nvm_aq_create: %s", nvm_strerror(status));
    if (status != 0) {
        return 1;
    }
    CHECK(nvm_ctrl_from_aq_ref(aq) == ctrl, "controller of the reference");
    status = nvm_admin_get_num_queues(aq, &n_cqs, &n_sqs);
    CHECK(status == 0 && n_cqs == 64 && n_sqs == 64, "get_num_queues %d %u %u", status, n_cqs, n_sqs);
    status = nvm_admin_ctrl_info(aq, &info, NVM_DMA_OFFSET(aq_win, 2), aq_win->ioaddrs[2]);
    CHECK(status == 0, "ctrl_info: %s", nvm_strerror(status));
    print_ctrl_info(&info);
    CHECK(memcmp(info.serial_no, "nvmesim0001         ", 20) == 0, "serial");
    CHECK(info.max_data_size == 131072, "mdts %zu", info.max_data_size);
    status = nvm_admin_ns_info(aq, &ns, 1, NVM_DMA_OFFSET(aq_win, 2), aq_win->ioaddrs[2]);
    CHECK(status == 0 && ns.lba_data_size == 512 && ns.size == 16384, "ns_info %d %zu %llu", status,
          ns.lba_data_size, (unsigned long long) ns.size);
    printf("Namespace identifier    : %x\nLogical block size      : %zu bytes\nNamespace size          : %llu blocks\n",
           ns.ns_id, ns.lba_data_size, (unsigned long long) ns.size);

    /* read-blocks: CQ page, SQ page, then PRP list pages */
    n_cqs = 1;
    n_sqs = 1;
    status = nvm_admin_request_num_queues(aq, &n_cqs, &n_sqs);
    CHECK(status == 0 && n_cqs == 1 && n_sqs == 1, "request_num_queues %d %u %u", status, n_cqs, n_sqs);
    q_mem = page_alloc(4, ps);
    status = map_virt(&q_win, ctrl, q_mem, 4);
    CHECK(status == 0, "queue window");
    status = nvm_admin_cq_create(aq, &cq, 1, NVM_DMA_OFFSET(q_win, 0), q_win->ioaddrs[0]);
    CHECK(status == 0, "cq_create: %s", nvm_strerror(status));
    status = nvm_admin_sq_create(aq, &sq, &cq, 1, NVM_DMA_OFFSET(q_win, 1), q_win->ioaddrs[1]);
    CHECK(status == 0, "sq_create: %s", nvm_strerror(status));
    if (failures) {
        return 1;
    }

    data = (unsigned char*) page_alloc(32, ps);
    status = map_virt(&data_win, ctrl, data, 32);
    CHECK(status == 0, "data window");

    /* PRP1 only, PRP1 + PRP2, a PRP list, and MDTS (32 pages) */
    {
        static const size_t pages[] = { 1, 2, 7, 32 };
        size_t k;
        for (k = 0; k < sizeof(pages) / sizeof(pages[0]); ++k) {
            uint64_t lba = 100 + 3 * k;
            memset(data, 0xee, 32 * ps);
            status = io(&sq, &cq, NVM_IO_READ, lba, (uint16_t) (pages[k] * ps / 512), data_win, 0, pages[k],
                        NVM_DMA_OFFSET(q_win, 2), q_win->ioaddrs[2]);
            CHECK(status == 0, "read of %zu pages: %s", pages[k], nvm_strerror(status));
            check_pattern(data, pages[k] * ps, lba * 512, "read");
        }
    }
    /* many single-block reads: the 64-entry SQ and 256-entry CQ wrap */
    for (n = 0; n < 600; ++n) {
        uint64_t lba = (n * 7919) % 16000;
        status = io(&sq, &cq, NVM_IO_READ, lba, 1, data_win, n % 32, 1, NULL, 0);
        if (status != 0) {
            CHECK(0, "read %zu: %s", n, nvm_strerror(status));
            break;
        }
        check_pattern(data + (n % 32) * ps, 512, lba * 512, "wrapping read");
    }
    /* a write, read back through the simulator */
    {
        unsigned char back[8192];
        size_t i;
        for (i = 0; i < 2 * ps; ++i) {
            data[i] = (unsigned char) (i * 13 + 5);
        }
        status = io(&sq, &cq, NVM_IO_WRITE, 4000, 16, data_win, 0, 2, NULL, 0);
        CHECK(status == 0, "write: %s", nvm_strerror(status));
        status = io(&sq, &cq, NVM_IO_FLUSH, 0, 1, data_win, 0, 1, NULL, 0);
        CHECK(status == 0, "flush: %s", nvm_strerror(status));
        CHECK(nvmesim_read_storage(sim, 4000 * 512, back, sizeof(back)) == 0, "storage");
        CHECK(memcmp(back, data, sizeof(back)) == 0, "written data on the medium");
    }
    /* errors come back packed, with the library's text */
    status = io(&sq, &cq, NVM_IO_READ, 16383, 8, data_win, 0, 1, NULL, 0);
    CHECK(status == -0x80, "read past the end gave %d", status);
    CHECK(strcmp(nvm_strerror(status), "LBA out of range") == 0, "text %s", nvm_strerror(status));
    CHECK(NVM_ERR_UNPACK_SC(status) == 0x80 && NVM_ERR_UNPACK_SCT(status) == 0, "unpack");
    CHECK(strcmp(nvm_strerror(EINVAL), "Invalid argument") == 0, "errno text");

    /* teardown as the latency benchmark does: SQ, then CQ */
    status = nvm_admin_sq_delete(aq, &sq, &cq);
    CHECK(status == 0 && sq.db == NULL, "sq_delete: %s", nvm_strerror(status));
    status = nvm_admin_cq_delete(aq, &cq);
    CHECK(status == 0 && cq.db == NULL, "cq_delete: %s", nvm_strerror(status));
    CHECK(nvm_admin_cq_delete(aq, &cq) == EINVAL, "second delete");

    nvm_dma_unmap(data_win);
    nvm_dma_unmap(q_win);
    nvm_aq_destroy(aq);
    nvm_dma_unmap(aq_win);
    nvm_ctrl_free(ctrl);
    free(data);
    free(q_mem);
    free(aq_mem);
    nvmesim_stop(sim);
    fprintf(stderr, "Goodbye!\n");
    if (failures) {
        fprintf(stderr, "consumer: %d checks failed\n", failures);
        return 1;
    }
    printf("consumer: all checks passed\n");
    return 0;
}
