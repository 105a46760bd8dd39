"""What a person does, as functions: answer an escalation, start a workflow, approve or reject a gate (abort a run
through its claim), send a packet, accept or forget a learned rule, explain a matrix verdict. The CLI and the web
console call the same functions, so every rule (the access matrix, the identity ``human``, dedupe, the audit) holds
whichever door the person uses.
"""
