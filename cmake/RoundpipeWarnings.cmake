# Project-wide warning set, applied per target with rp_set_warnings(target).
function(rp_set_warnings target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wno-unused-parameter -Wno-missing-field-initializers)
endfunction()
