// The verbs conformance suite (conformance.h) instantiated over every provider path; its cases
// are in conformance_<topic>.cc, one file per topic.
#include "verbs/conformance.h"

namespace ferry::test {

INSTANTIATE_TEST_SUITE_P(Providers, VerbsConformance, ::testing::ValuesIn(providerPaths()),
                         providerPathTestName);

}  // namespace ferry::test
