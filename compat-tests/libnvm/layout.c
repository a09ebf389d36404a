/*
 * ABI check of the installed nvm_*.h: sizes, alignments and offsets of every public struct,
 * constant values, and the behaviour of the header-only helpers, against the values of
 * ../shared/spec/libnvm.md (§A3, §A4, §A6, §A7). Compiled as C and as C++; prints one line per
 * failure and exits 1 if any.
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
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#ifdef __cplusplus
#define ALIGNOF(t) alignof(t)
#else
#define ALIGNOF(t) _Alignof(t)
#endif

static int fails;
static int checks;

#define EQ(expr, want) do { \
    unsigned long long got_ = (unsigned long long) (expr); \
    ++checks; \
    if (got_ != (unsigned long long) (want)) { \
        printf("FAIL %s:%d: %s = %llu (0x%llx), want %llu\n", __FILE__, __LINE__, #expr, got_, got_, \
               (unsigned long long) (want)); \
        ++fails; \
    } \
} while (0)

#define OFF(type, field, want) EQ(offsetof(type, field), want)

static void layouts(void)
{
    EQ(sizeof(nvm_ctrl_t), 48); EQ(ALIGNOF(nvm_ctrl_t), 8);
    OFF(nvm_ctrl_t, page_size, 0); OFF(nvm_ctrl_t, dstrd, 8); OFF(nvm_ctrl_t, timeout, 16);
    OFF(nvm_ctrl_t, max_entries, 24); OFF(nvm_ctrl_t, mm_size, 32); OFF(nvm_ctrl_t, mm_ptr, 40);

    EQ(sizeof(nvm_dma_t), 32); EQ(ALIGNOF(nvm_dma_t), 32);
    OFF(nvm_dma_t, vaddr, 0); OFF(nvm_dma_t, page_size, 8); OFF(nvm_dma_t, n_ioaddrs, 16);
    OFF(nvm_dma_t, ioaddrs, 24);

    EQ(sizeof(nvm_queue_t), 64); EQ(ALIGNOF(nvm_queue_t), 64);
    OFF(nvm_queue_t, no, 0); OFF(nvm_queue_t, max_entries, 2); OFF(nvm_queue_t, entry_size, 4);
    OFF(nvm_queue_t, head, 8); OFF(nvm_queue_t, tail, 12); OFF(nvm_queue_t, phase, 16);
    OFF(nvm_queue_t, last, 20); OFF(nvm_queue_t, db, 24); OFF(nvm_queue_t, vaddr, 32);
    OFF(nvm_queue_t, ioaddr, 40);

    EQ(sizeof(nvm_cpl_t), 16); EQ(ALIGNOF(nvm_cpl_t), 16);
    EQ(sizeof(nvm_cmd_t), 64); EQ(ALIGNOF(nvm_cmd_t), 64);

    EQ(sizeof(struct nvm_ctrl_info), 160); EQ(ALIGNOF(struct nvm_ctrl_info), 8);
    OFF(struct nvm_ctrl_info, nvme_version, 0); OFF(struct nvm_ctrl_info, page_size, 8);
    OFF(struct nvm_ctrl_info, db_stride, 16); OFF(struct nvm_ctrl_info, timeout, 24);
    OFF(struct nvm_ctrl_info, contiguous, 32); OFF(struct nvm_ctrl_info, max_entries, 36);
    OFF(struct nvm_ctrl_info, pci_vendor, 38); OFF(struct nvm_ctrl_info, serial_no, 42);
    OFF(struct nvm_ctrl_info, model_no, 62); OFF(struct nvm_ctrl_info, firmware, 102);
    OFF(struct nvm_ctrl_info, max_data_size, 112); OFF(struct nvm_ctrl_info, max_data_pages, 120);
    OFF(struct nvm_ctrl_info, cq_entry_size, 128); OFF(struct nvm_ctrl_info, sq_entry_size, 136);
    OFF(struct nvm_ctrl_info, max_out_cmds, 144); OFF(struct nvm_ctrl_info, max_n_ns, 152);

    EQ(sizeof(struct nvm_ns_info), 48);
    OFF(struct nvm_ns_info, ns_id, 0); OFF(struct nvm_ns_info, size, 8);
    OFF(struct nvm_ns_info, capacity, 16); OFF(struct nvm_ns_info, utilization, 24);
    OFF(struct nvm_ns_info, lba_data_size, 32); OFF(struct nvm_ns_info, metadata_size, 40);

    EQ(sizeof(nvm_aq_ref), sizeof(void*));
    EQ(sizeof(enum nvm_io_command_set), 4);
}

static void constants(void)
{
    EQ(NVM_CTRL_MEM_MINSIZE, 0x2000);
    EQ(NVM_CMD_NS_ALL, 0xffffffffu);
    EQ(NVM_IO_FLUSH, 0x00); EQ(NVM_IO_WRITE, 0x01); EQ(NVM_IO_READ, 0x02); EQ(NVM_IO_WRITE_ZEROES, 0x08);
    EQ(NVM_ADMIN_DELETE_SUBMISSION_QUEUE, 0x00); EQ(NVM_ADMIN_CREATE_SUBMISSION_QUEUE, 0x01);
    EQ(NVM_ADMIN_GET_LOG_PAGE, 0x02); EQ(NVM_ADMIN_DELETE_COMPLETION_QUEUE, 0x04);
    EQ(NVM_ADMIN_CREATE_COMPLETION_QUEUE, 0x05); EQ(NVM_ADMIN_IDENTIFY, 0x06);
    EQ(NVM_ADMIN_ABORT, 0x08); EQ(NVM_ADMIN_SET_FEATURES, 0x09); EQ(NVM_ADMIN_GET_FEATURES, 0x0A);
}

static void util_macros(void)
{
    uint32_t v = 0xABCD1234;
    EQ(_RB(v, 15, 8), 0x12);
    EQ(_WB(0x5, 11, 9), 0xA00);
    EQ(_RB(~0ULL, 63, 0), ~0ULL);
    EQ(NVM_PAGE_TO_BLOCK(4096, 512, 3), 24);
    EQ(NVM_BLOCK_TO_PAGE(4096, 512, 24), 3);
    EQ(NVM_PAGE_ALIGN(4097, 4096), 8192);
    EQ(NVM_ADDR_MASK(0x12345, 4096), 0x12000);
    EQ(NVM_ADDR_OFFSET(0x1000, 4096, 3), 0x4000);
    {
        nvm_ctrl_t c;
        memset(&c, 0, sizeof(c));
        c.page_size = 4096;
        EQ(NVM_CTRL_ALIGN(&c, 1), 4096);
        EQ(NVM_CTRL_PAGES(&c, 8193), 3);
    }
    {
        nvm_cmd_t cmd;
        nvm_cpl_t cpl;
        memset(&cmd, 0, sizeof(cmd));
        memset(&cpl, 0, sizeof(cpl));
        *NVM_CMD_CID(&cmd) = 0x1234;
        *NVM_CMD_NSID(&cmd) = 7;
        EQ(cmd.dword[0], 0x12340000);
        EQ(cmd.dword[1], 7);
        cpl.dword[2] = 0x00050009;
        cpl.dword[3] = 0x8005002A;
        EQ(*NVM_CPL_SQHD(&cpl), 9); EQ(*NVM_CPL_SQID(&cpl), 5); EQ(*NVM_CPL_CID(&cpl), 0x2A);
        EQ(*NVM_CPL_STATUS(&cpl), 0x8005);
        EQ(NVM_ERR_SCT(&cpl), 0); EQ(NVM_ERR_SC(&cpl), 2); EQ(NVM_ERR_DNR(&cpl), 1);
        EQ(NVM_ERR_STATUS(&cpl), (unsigned long long) (long long) -2);
        EQ(NVM_ERR_OK(&cpl), 0);
        EQ(NVM_ERR_PACK(&cpl, 0), (unsigned long long) (long long) -2);
        EQ(NVM_ERR_PACK(&cpl, 22), 22);
        cpl.dword[3] = (uint32_t) ((1u << 9 | 0x0C << 1 | 1) << 16);
        EQ(NVM_ERR_STATUS(&cpl), (unsigned long long) (long long) -0x10C);
        EQ(NVM_ERR_STATUS((nvm_cpl_t*) NULL), 0);
        EQ(NVM_ERR_UNPACK_ERRNO(22), 22); EQ(NVM_ERR_UNPACK_ERRNO(-5), 0);
        EQ(NVM_ERR_UNPACK_SCT(-0x10C), 1); EQ(NVM_ERR_UNPACK_SC(-0x10C), 0x0C);
        EQ(NVM_ERR_UNPACK_SCT(22), 0);
        EQ(nvm_ok(0), 1); EQ(nvm_ok(-1), 0);
    }
}

static void command_helpers(void)
{
    nvm_cmd_t cmd;
    uint64_t data[6] = { 0x1000, 0x2000, 0x3000, 0x4000, 0x5000, 0x6000 };
    uint64_t list[512];
    size_t n;

    memset(&cmd, 0xff, sizeof(cmd));
    nvm_cmd_header(&cmd, 0xBEEF, 0x82, 1);
    EQ(cmd.dword[0], 0xBEEF0002);   /* opcode & 0x7f */
    EQ(cmd.dword[1], 1);
    EQ(cmd.dword[2], 0xffffffffu);  /* untouched */
    cmd.dword[0] |= 0xC700;
    nvm_cmd_data_ptr(&cmd, 0x1122334455667788ULL, 0x99);
    EQ(cmd.dword[0], 0xBEEF0402);  /* FUSE, PSDT cleared; bit 10 kept */
    EQ(cmd.dword[6], 0x55667788); EQ(cmd.dword[7], 0x11223344); EQ(cmd.dword[8], 0x99); EQ(cmd.dword[9], 0);
    cmd.dword[12] = 0xABCD0000;
    nvm_cmd_rw_blks(&cmd, 0x100000002ULL, 8);
    EQ(cmd.dword[10], 2); EQ(cmd.dword[11], 1); EQ(cmd.dword[12], 0xABCD0007);
    nvm_cmd_rw_blks(&cmd, 0, 0);
    EQ(cmd.dword[12], 0xABCDFFFF);

    memset(&cmd, 0, sizeof(cmd));
    EQ(nvm_cmd_data(&cmd, 4096, 0, list, 0x9000, data), 0);
    EQ(nvm_cmd_data(&cmd, 4096, 1, list, 0x9000, data), 1);
    EQ(cmd.dword[6], 0x1000); EQ(cmd.dword[8], 0);
    EQ(nvm_cmd_data(&cmd, 4096, 2, list, 0x9000, data), 2);
    EQ(cmd.dword[8], 0x2000);
    memset(list, 0, sizeof(list));
    n = nvm_cmd_data(&cmd, 4096, 5, list, 0x9000, data);
    EQ(n, 5); EQ(cmd.dword[6], 0x1000); EQ(cmd.dword[8], 0x9000);
    EQ(list[0], 0x2000); EQ(list[3], 0x5000); EQ(list[4], 0);
    EQ(nvm_cmd_data(&cmd, 4096, 5, NULL, 0, data), 2);  /* no list: two pages */
    EQ(nvm_prp_list(64, 100, list, data), 8);            /* one list page, never chained */
}

static void queue_helpers(void)
{
    static nvm_cmd_t ring[5];
    static nvm_cpl_t cring[4];
    static uint32_t db[2];
    nvm_queue_t sq, cq;
    int i, got = 0;

    memset(&sq, 0, sizeof(sq));
    sq.max_entries = 5;   /* not a power of two: upstream's full test is wrong here */
    sq.entry_size = 64;
    sq.phase = 1;
    sq.vaddr = ring;
    sq.db = &db[0];
    EQ((uintptr_t) nvm_sq_enqueue(&sq), (uintptr_t) &ring[0]);
    EQ(NVM_DEFAULT_CID(&sq), 1);
    for (i = 0; i < 10; ++i) {
        if (nvm_sq_enqueue(&sq) != NULL) {
            ++got;
        }
    }
    EQ(got, 3);           /* 4 of 5 slots usable in all */
    nvm_sq_submit(&sq);
    EQ(db[0], 4); EQ(sq.last, 4);
    db[0] = 99;
    nvm_sq_submit(&sq);   /* nothing new: no doorbell write */
    EQ(db[0], 99);
    nvm_sq_update(&sq); nvm_sq_update(&sq);
    EQ(sq.head, 2);
    EQ((uintptr_t) nvm_sq_enqueue(&sq), (uintptr_t) &ring[4]);
    EQ(sq.tail, 0); EQ(sq.phase, 0);
    EQ(NVM_DEFAULT_CID(&sq), 5);

    memset(&cq, 0, sizeof(cq));
    memset(cring, 0, sizeof(cring));
    cq.max_entries = 4;
    cq.entry_size = 16;
    cq.phase = 1;
    cq.vaddr = cring;
    cq.db = &db[1];
    EQ((uintptr_t) nvm_cq_poll(&cq), 0);
    for (i = 0; i < 4; ++i) {
        cring[i].dword[3] = 0x10000;  /* phase 1 */
    }
    for (i = 0; i < 4; ++i) {
        EQ((uintptr_t) nvm_cq_dequeue(&cq), (uintptr_t) &cring[i]);
    }
    EQ(cq.head, 0); EQ(cq.phase, 0);
    EQ((uintptr_t) nvm_cq_poll(&cq), 0);  /* old phase-1 entries are not new on lap 2 */
    nvm_cq_update(&cq);
    EQ(db[1], 0); EQ(cq.last, 0);
    cring[0].dword[3] = 0;                /* phase 0 = new on lap 2 */
    EQ((uintptr_t) nvm_cq_dequeue(&cq), (uintptr_t) &cring[0]);
    nvm_cq_update(&cq);
    EQ(db[1], 1);
}

int main(void)
{
    layouts();
    constants();
    util_macros();
    command_helpers();
    queue_helpers();
    if (fails) {
        printf("layout: %d of %d checks failed\n", fails, checks);
        return 1;
    }
    printf("layout: all %d checks passed\n", checks);
    return 0;
}
