/* dlsym, as libphos.so exports it.
 *
 * Why assembly: glibc's dlsym resolves RTLD_NEXT relative to its caller's
 * return address. A C wrapper that calls glibc's dlsym would make libphos.so
 * the caller and change what RTLD_NEXT finds for every other library. This
 * stub asks phos_dlsym_hook first (it answers only for libcuda functions that
 * phos wraps) and otherwise jumps to glibc's dlsym with the caller's own
 * return address still on the stack. */
	.text
	.globl	dlsym
	.type	dlsym, @function
dlsym:
	.cfi_startproc
	pushq	%rdi
	.cfi_adjust_cfa_offset 8
	pushq	%rsi
	.cfi_adjust_cfa_offset 8
	subq	$8, %rsp			/* keep the stack 16-byte aligned for the call */
	.cfi_adjust_cfa_offset 8
	call	phos_dlsym_hook
	addq	$8, %rsp
	.cfi_adjust_cfa_offset -8
	popq	%rsi
	.cfi_adjust_cfa_offset -8
	popq	%rdi
	.cfi_adjust_cfa_offset -8
	testq	%rax, %rax
	jnz	1f
	jmp	*phos_glibc_dlsym(%rip)
1:
	ret
	.cfi_endproc
	.size	dlsym, .-dlsym
	.section .note.GNU-stack,"",@progbits
