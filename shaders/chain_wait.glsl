// A chained consumer's wait (kernels/chain.py): one lane polls chain[p.wait_slot] until the producer's
// p.wait_n workgroups have counted, then the workgroup barrier. The poll count is stored where it is
// never read: a loop with no effect but its own end may be deleted by the compiler (NVIDIA's was, and
// the consumer then read its input at once). No fence after the poll: the inputs are read through
// coherent declarations after the count was seen (a fence would first wait for this lane's earlier
// loads). The including kernel declares the buffer `chain` and the push fields wait_slot, wait_n.
void wait_for_producer() {
    if (gl_LocalInvocationIndex == 0) {
        uint polls = 0u;
        while (chain[p.wait_slot] < p.wait_n) ++polls;
        if (polls == 0xFFFFFFFFu) chain[p.wait_slot + 1] = polls;
    }
    barrier();
}
