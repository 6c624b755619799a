//! Model configuration (`config.pbtxt`): parsing, printing, validation.
//! PLACEHOLDER: being written.
